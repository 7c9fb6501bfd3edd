"""How close `matrun tune` gets to the exhaustive sweep's best, and with how many runs.

The reference: benchmarks/tune-space.toml (200 LeNet-5 cells of real Fashion-MNIST over 7
axes — framework torch/jax, threads, batch size, layout, precision, oneDNN, inter-op threads —
three runs each: one run of a cell on this VM can land in a slow mode of the process) swept in
full by `matrun sweep --repeats 3`, plus each framework's default cell (the cell
`matrun tune` compares against, run through `matrun sweep --set …`).  Then, per search strategy
(tpe: matrun's; optuna: Optuna's default sampler; random) and seed, the search of
runner/sweep/tune.py (the same Tuner class `matrun tune` runs) is replayed on the reference: a
trial "runs" its cell by taking the cell's next measured run from the reference (its first
repeat, then the second...), so every strategy and seed sees the same numbers, and the runs it
spends are counted.  The budget is a quarter of the space's cells (a quarter of an exhaustive
sweep of one run per cell).  Each replay runs without and with the confirmation (extra runs of
the leaders and the defaults; at most the reference's three per cell here); a cell found is
judged by its median over the reference's runs against the best median at equal accuracy.
`--live` runs one real `matrun tune` (seed 0, tpe, confirmation on) into an empty warehouse
afterwards and looks its answer up in the reference.

Printed: per strategy and seed, the runs used, the best feasible cell found per framework,
its throughput and the gap to the exhaustive best of that framework at equal accuracy
(accuracy at most --accuracy-within points below the framework's default cell).

    python benchmarks/tune_search.py --work /tmp/tune-bench [--seeds 3] [--share 0.25] [--live]

Takes about 55 minutes on a 2-core host from nothing (the reference sweep, 606 runs), a minute
afterwards (the replays), 5 minutes more with --live.  Time nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.identity import identify
from matrun.runner.planning.matrix import CellParams, load_space
from matrun.runner.planning.params import as_text
from matrun.runner.sweep import tune as tn
from matrun.warehouse.compare import fetch, reader

HERE = Path(__file__).resolve().parent
SPACE = HERE / "tune-space.toml"
MATRUN = str(Path(sys.executable).with_name("matrun"))


def sweep_reference(work: Path) -> tuple[Path, Any]:
    """The exhaustive sweep and the default cells, in ``work`` (kept: a second call reuses them)."""
    work.mkdir(parents=True, exist_ok=True)
    matrix = work / "tune-space.toml"
    if not matrix.exists():
        shutil.copy(SPACE, matrix)
    space = load_space(matrix)
    began = time.monotonic()
    subprocess.run([MATRUN, "sweep", str(matrix), "--executor", "local", "--repeats", "3"], check=True)
    dims = tn.dimensions(space)
    for fw in tn.frameworks_of(space):
        combo = tn.default_combo(space, dims, fw)
        sets = [a for k, v in combo.items() for a in ("--set", f"{k}={as_text(v)}")]
        subprocess.run([MATRUN, "sweep", str(matrix), "--executor", "local", "--repeats", "3", *sets], check=True)
    print(f"reference: swept in {time.monotonic() - began:.0f} s (0 s when it was there already)", file=sys.stderr)
    return matrix, space


def reference_runs(warehouse: Path) -> dict[str, dict[str, Any]]:
    with reader(warehouse) as con:
        rows = fetch(con, """
            SELECT cell_id, framework, throughput, accuracy, wall_seconds
            FROM run_overview WHERE status = 'ok' AND "repeat" <> canary_repeat() ORDER BY "repeat", started_at""")
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = out.setdefault(r["cell_id"], {"framework": r["framework"], "values": [], "acc": [], "wall": []})
        c["values"].append(r["throughput"])
        c["acc"].append(r["accuracy"])
        c["wall"].append(r["wall_seconds"] or 0.0)
    return out


class Replay:
    """Measure and evidence for the Tuner from the reference: a cell's run is the reference's.
    A cell's runs are exchangeable (one of them may have landed in the VM's slow mode, at any
    repeat), so each replay takes them in an order drawn from its seed: a seed is one
    realisation of the measurement noise, as a tuning run at another time would meet."""

    def __init__(self, ref: Mapping[str, dict[str, Any]], cell_id: Any, seed: int) -> None:
        self.cell_id = cell_id
        self.ref = {}
        for cid, c in ref.items():
            order = list(range(len(c["values"])))
            random.Random(f"{seed}-{cid}").shuffle(order)
            self.ref[cid] = {**c, **{k: [c[k][i] for i in order] for k in ("values", "acc", "wall")}}
        self.taken: dict[str, int] = {}

    def measure(self, cell: CellParams, combo: Mapping[str, Any], runs: int) -> tuple[int, float]:
        cid = self.cell_id(cell)
        have = self.taken.get(cid, 0)
        if cid not in self.ref:
            raise SystemExit(f"cell {cid} ({tn.label_of(combo)}) is not in the reference")
        n = min(runs, len(self.ref[cid]["values"]))
        self.taken[cid] = max(have, n)
        return max(0, n - have), sum(self.ref[cid]["wall"][have:n])

    def evidence(self, cell_ids: Sequence[str]) -> dict[str, tn.Evidence]:
        out = {}
        for cid in cell_ids:
            n = self.taken.get(cid, 0)
            if n and cid in self.ref:
                c = self.ref[cid]
                out[cid] = tn.Evidence(values=c["values"][:n], accuracies=c["acc"][:n], ok=n)
        return out


class Memory:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def trials(self) -> list[dict[str, Any]]:
        return []

    def add(self, trial: dict[str, Any]) -> None:
        self.rows.append(trial)

    def save(self, status: str, summary: Any) -> None:
        pass


def exhaustive_best(ref: Mapping[str, dict[str, Any]], space_ids: set[str], defaults: Mapping[str, str],
                    within: float) -> dict[str, tuple[str, float]]:
    best: dict[str, tuple[str, float]] = {}
    for fw, did in defaults.items():
        floor = statistics.median(ref[did]["acc"]) - within / 100
        feasible = [(cid, statistics.median(c["values"])) for cid, c in ref.items()
                    if cid in space_ids and c["framework"] == fw and statistics.median(c["acc"]) >= floor]
        best[fw] = max(feasible, key=lambda x: x[1])
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--accuracy-within", type=float, default=2.0)
    ap.add_argument("--live", action="store_true")
    args = ap.parse_args()
    matrix, space = sweep_reference(args.work)
    runner, _ = get_executor("local")
    ids = lambda cell: identify(cell, runner.env_id)[0]  # noqa: E731
    ref = reference_runs(space.sweep.warehouse)
    dims = tn.dimensions(space)
    defaults = {}
    for fw in tn.frameworks_of(space):
        cell = tn.cell_for(space, tn.default_combo(space, dims, fw))
        assert not isinstance(cell, str), cell
        defaults[fw] = ids(cell)
    from matrun.runner.planning.matrix import load_matrix
    space_ids = {identify(c, runner.env_id)[0] for c in load_matrix(matrix).cells}
    exhaustive_runs = sum(len(ref[c]["values"]) for c in space_ids if c in ref)
    # a quarter of the space's cells: a quarter of an exhaustive sweep of one run per cell (the
    # reference itself has more runs per cell, for its medians)
    budget = int(len(space_ids) * args.share)
    best = exhaustive_best(ref, space_ids, defaults, args.accuracy_within)
    print(f"space: {len(space_ids)} cells swept ({exhaustive_runs} runs, medians of "
          f"{exhaustive_runs / len(space_ids):.2g} per cell), {space.size} combinations of {len(space.axes)} axes; "
          f"budget {budget} runs ({args.share:.0%} of the cells); accuracy within "
          f"{args.accuracy_within:g} points of the default")
    for fw, (cid, v) in best.items():
        d = defaults[fw]
        print(f"exhaustive best {fw}: {v:,.1f} img/s ({cid}); default {statistics.median(ref[d]['values']):,.1f} img/s, "
              f"accuracy {statistics.median(ref[d]['acc']) * 100:.2f} %")
    print(f"\n{'strategy':<8} {'confirm':>7} {'seed':>4} {'runs':>5} "
          + " ".join(f"{fw + ' best':>14} {'gap':>7}" for fw in best) + "  within 3 %")
    results: dict[tuple[str, bool], list[bool]] = {}
    for confirm in (False, True):
        for strategy in tn.SAMPLERS:
            for seed in range(args.seeds):
                replay = Replay(ref, ids, seed)
                settings = tn.Settings(objective="throughput", accuracy_within=args.accuracy_within,
                                       sampler=strategy, seed=seed, budget_runs=budget, confirm=confirm)
                tuner = tn.Tuner(space, settings, measure=replay.measure, evidence=replay.evidence, store=Memory(),
                                 cell_id=ids)
                s = tuner.run()
                cols, ok = [], True
                for a in s["answer"]:
                    fw = a["framework"]
                    found = (a["best"] or {}).get("cell_id")
                    v = statistics.median(ref[found]["values"]) if found else 0.0
                    gap = 1 - v / best[fw][1]
                    ok &= gap <= 0.03
                    cols.append(f"{v:>14,.1f} {gap:>7.1%}")
                results.setdefault((strategy, confirm), []).append(ok)
                print(f"{strategy:<8} {'yes' if confirm else 'no':>7} {seed:>4} {s['runs']:>5} " + " ".join(cols)
                      + f"  {'yes' if ok else 'no'}")
    print()
    for (strategy, confirm), oks in results.items():
        print(f"{strategy} ({'with' if confirm else 'without'} confirmation): within 3 % of the exhaustive best in "
              f"both frameworks in {sum(oks[:3])} of the first 3 seeds, {sum(oks)} of {len(oks)}")
    # the noise floor: the exhaustive sweep itself, one run per cell (each of the reference's
    # passes alone), judged the same way
    passes = min(len(c["values"]) for cid, c in ref.items() if cid in space_ids)
    for p in range(passes):
        cols, ok = [], True
        for fw, did in defaults.items():
            floor = statistics.median(ref[did]["acc"]) - args.accuracy_within / 100
            v, cid = max((c["values"][p], cid) for cid, c in ref.items()
                         if cid in space_ids and c["framework"] == fw and statistics.median(c["acc"]) >= floor)
            gap = 1 - statistics.median(ref[cid]["values"]) / best[fw][1]
            ok &= gap <= 0.03
            cols.append(f"{fw} {gap:.1%}")
        print(f"exhaustive sweep, one run per cell (pass {p}, {len(space_ids)} runs): the cell it picks is "
              f"{', '.join(cols)} short of the best median; within 3 % in both: {'yes' if ok else 'no'}")
    if args.live:
        live = args.work / "live"
        if live.exists():
            shutil.rmtree(live)
        live.mkdir()
        shutil.copy(matrix, live / "tune-space.toml")
        began = time.monotonic()
        proc = subprocess.run([MATRUN, "tune", str(live / "tune-space.toml"), "--budget", str(budget),
                               "--accuracy-within", f"{args.accuracy_within:g}", "--seed", "0", "--executor", "local",
                               "--format", "json"], capture_output=True, text=True)
        (args.work / "live-stderr.txt").write_text(proc.stderr)
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            raise SystemExit(f"matrun tune exited {proc.returncode}")
        doc = json.loads(proc.stdout)
        (args.work / "live.json").write_text(proc.stdout)
        print(f"\nlive matrun tune (tpe, seed 0, confirmation on): {doc['runs']} runs in "
              f"{time.monotonic() - began:.0f} s")
        for a in doc["answer"]:
            fw, found = a["framework"], (a["best"] or {}).get("cell_id")
            v = statistics.median(ref[found]["values"]) if found in ref else float("nan")
            print(f"  {fw}: {a['best']['label'] if a['best'] else '-'}: live {a['best']['median'] if a['best'] else 0:,.1f}"
                  f" img/s over {a['best']['runs'] if a['best'] else 0} runs; in the reference {v:,.1f} img/s, gap "
                  f"{1 - v / best[fw][1]:.1%} to the exhaustive best; vs default: {a['verdict']}")


if __name__ == "__main__":
    main()
