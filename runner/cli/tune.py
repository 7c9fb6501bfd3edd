"""``matrun tune``: the fastest configuration of a matrix's space at equal accuracy, searched
with Optuna instead of run in full (runner/sweep/tune.py; docs/TUNE.md)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional, Sequence

import typer
from rich.table import Table

from matrun.errors import InputError, NotAWarehouse, SweepLocked
from matrun.runner.cli.common import MatrixArg, ProfileOpt, SetOpt, app, check_format, command, duration_text, err, out
from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.identity import identify
from matrun.runner.planning.matrix import CellParams, Space, load_space
from matrun.runner.planning.overrides import parse_overrides
from matrun.runner.sweep.records import RunClaim
from matrun.runner.sweep.run import run_sweep
from matrun.warehouse.compare import fetch, fmt_num, fmt_p, fmt_ratio_ci, reader

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\Z")
#: objective -> the run_overview column it reads
COLUMNS = {"throughput": "o.throughput", "train_s": "CASE WHEN r.diverged THEN NULL ELSE r.train_seconds END",
           "j_per_image": "o.j_per_image"}


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """``50`` → 50 runs; ``90s``, ``30m``, ``2h``, ``1h30m`` → seconds.  ``InputError`` otherwise."""
    value = text.strip()
    if re.fullmatch(r"[0-9]{1,12}", value):
        n = int(value)
        if n < 1 or n > 1_000_000:
            raise InputError(f"--budget: expected from 1 to 1,000,000 runs, got {text!r}")
        return n, None
    m = _DURATION.match(value)
    if value and m and any(m.groups()):
        h, mi, s = (int(g or 0) for g in m.groups())
        seconds = h * 3600 + mi * 60 + s
        if 0 < seconds <= 30 * 86400:
            return None, float(seconds)
    raise InputError(f"--budget: expected a number of runs (50) or a duration (90s, 30m, 2h, 1h30m; at most 30 "
                     f"days), got {text[:60]!r}")


@command(app)
def tune(
    matrix: MatrixArg = Path("matrix.toml"),
    budget: Annotated[str, typer.Option("--budget", metavar="RUNS|DURATION", help="What the tuning may spend: "
                                        "runs (50) or time (30m, 2h); runs done before cost nothing.")] = "",
    objective: Annotated[str, typer.Option("--objective", metavar="OBJECTIVE", help="throughput (the most), "
                                           "train_s or j_per_image (the least).")] = "throughput",
    accuracy_within: Annotated[Optional[float], typer.Option(
        "--accuracy-within", metavar="POINTS", help="Infeasible: a configuration whose accuracy is more than "
        "POINTS below its framework's default cell.")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="The sampler's seed.")] = 0,
    sampler: Annotated[str, typer.Option("--sampler", metavar="SAMPLER", help="tpe (matrun's), optuna (Optuna's "
                                         "default sampler) or random.")] = "tpe",
    repeats: Annotated[int, typer.Option("--repeats", metavar="N", help="Runs per new configuration.")] = 1,
    confirm: Annotated[bool, typer.Option("--confirm/--no-confirm", help="Spend the last runs on the leaders, "
                                          "their close contenders and the defaults.")] = True,
    profile: ProfileOpt = None,
    sets: SetOpt = [],
    executor: Annotated[Optional[str], typer.Option("--executor", help="local, docker or slurm (default: the "
                                                    "matrix's).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table or json.")] = "table",
) -> None:
    """Search MATRIX's axes for the best configuration of each framework against its default,
    running only the cells the search asks for (each a real cell, recorded like any run)."""
    from matrun.runner.sweep import tune as tn  # Optuna loads slowly: only here
    from matrun.warehouse import tunings

    check_format(fmt, ("table", "json"))
    if objective not in tn.OBJECTIVES:
        raise InputError(f"--objective: expected one of {', '.join(tn.OBJECTIVES)}, got {objective[:60]!r}")
    if sampler not in tn.SAMPLERS:
        raise InputError(f"--sampler: expected one of {', '.join(tn.SAMPLERS)}, got {sampler[:60]!r}")
    if not budget:
        raise InputError("--budget is missing: give runs (--budget 50) or a duration (--budget 30m)")
    budget_runs, budget_s = parse_budget(budget)
    if not 1 <= repeats <= 100:
        raise InputError(f"--repeats: expected from 1 to 100 runs per configuration, got {repeats}")
    if executor is not None and executor not in ("local", "docker", "slurm"):
        raise InputError(f"--executor: expected local, docker or slurm, got {executor!r}")
    space = load_space(matrix, profile, parse_overrides(sets))
    settings = tn.Settings(objective=objective, accuracy_within=accuracy_within, sampler=sampler, seed=seed,
                           budget_runs=budget_runs, budget_s=budget_s, repeats=repeats, confirm=confirm)
    runner, picked = get_executor(executor or space.sweep.executor)
    warehouse = space.sweep.warehouse
    tid = tn.tuning_id(space, settings)
    evidence = _Evidence(warehouse, objective)
    display = _Quiet()

    def cell_id(cell: CellParams) -> str:
        return identify(cell, runner.env_id)[0]

    def measure(cell: CellParams, combo: Mapping[str, Any], runs: int) -> tuple[int, float]:
        import time
        began = time.monotonic()
        cid = cell_id(cell)
        try:
            summary = run_sweep(matrix_path=space.path, executor=runner.name, on_event=display, profile=space.profile,
                                overrides={**space.overrides, **combo}, where=[f"cell={cid}"],
                                repeats={"repeats": runs, "repeats_max": None, "max_time": None},
                                canary=False, register=False)
        finally:
            evidence.forget(cid)
        return summary.ran, time.monotonic() - began

    claim = RunClaim(space.sweep.results, f"tune-{tid}", 0, space.sweep.name)
    space.sweep.results.mkdir(parents=True, exist_ok=True)
    if not claim.take(wait=False):
        raise SweepLocked(f"tuning {tid} of {matrix} is running in another matrun tune ({claim.holder()}); wait for it "
                          "to end, then run this again: it resumes from the trials recorded")
    try:
        store = _Store(warehouse, tid, {
            "tuning": tid, "matrix": str(matrix), "sweep": space.sweep.name, "objective": objective,
            "direction": "maximize" if tn.OBJECTIVES[objective][0] else "minimize",
            "accuracy_within": accuracy_within, "sampler": sampler, "seed": seed, "space": _space_doc(space),
            "budget": {"runs": budget_runs, "seconds": budget_s}},
            tunings)
        tuner = tn.Tuner(space, settings, measure=measure, evidence=evidence, store=store,
                         cell_id=cell_id, log=lambda s: typer.echo(f"tune: {s}", err=True))
        typer.echo(f"tune {tid}: {space.size:,} combinations of {len(tuner.searched)} parameters "
                   f"({', '.join(d.name for d in tuner.searched)}); {objective}, sampler {sampler}, seed {seed}; "
                   f"budget {budget}; {picked}", err=True)
        summary = tuner.run()
    finally:
        claim.release()
    if fmt == "json":
        sys.stdout.write(json.dumps({"tuning": tid, **summary}, indent=2, allow_nan=False, default=_nan) + "\n")
        return
    _print(tid, summary)


def _nan(value: Any) -> Any:
    return None


def _space_doc(space: Space) -> dict[str, Any]:
    return json.loads(json.dumps({
        "axes": {k: list(v) for k, v in space.axes.items()},
        "zips": [{k: list(v) for k, v in g.items()} for g in space.zips],
        "fixed": dict(space.fixed), "size": space.size, "profile": space.profile,
        "overrides": dict(space.overrides)}, default=str))


class _Quiet:
    """The sweep's events as a tuning shows them: its messages once each, failed runs; no plan lines."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, event: Any) -> None:
        if event.kind == "message" and event.text not in self.seen:
            self.seen.add(event.text)
            typer.echo(event.text, err=True)
        elif event.kind == "run-end" and event.outcome is not None and event.outcome.status != "ok":
            tail = (event.outcome.error_tail or "").strip().splitlines()[-1:] or [""]
            typer.echo(f"  {event.outcome.status} cell {event.cell.cell_id} repeat {event.repeat}: {tail[0][:200]}",
                       err=True)


class _Evidence:
    """Cells' runs from the warehouse (``run_overview``), cached until the tuning runs the cell."""

    def __init__(self, warehouse: Path, objective: str) -> None:
        self.warehouse, self.column = warehouse, COLUMNS.get(objective, "o.throughput")
        self.cache: dict[str, Any] = {}

    def forget(self, cell_id: str) -> None:
        self.cache.pop(cell_id, None)

    def __call__(self, cell_ids: Sequence[str]) -> dict[str, Any]:
        from matrun.runner.sweep.tune import Evidence
        wanted = [c for c in cell_ids if c and c not in self.cache]
        if wanted:
            found: dict[str, Any] = {c: Evidence() for c in wanted}
            try:
                with reader(self.warehouse) as con:
                    rows = fetch(con, f"""
                        SELECT o.cell_id, o.status, {self.column} AS v, o.accuracy,
                               coalesce(o.busy_start, false) AS busy, r.error_tail
                        FROM run_overview AS o JOIN runs AS r ON r.run_id = o.run_id
                        WHERE list_contains($ids, o.cell_id) AND o."repeat" <> canary_repeat()
                        ORDER BY o.started_at""", {"ids": wanted})
            except NotAWarehouse:
                rows = []  # no warehouse yet: nothing measured
            clean = {r["cell_id"] for r in rows if r["status"] == "ok" and not r["busy"]}
            for r in rows:
                ev = found[r["cell_id"]]
                if r["status"] != "ok":
                    ev.failed += 1
                    ev.reason = f"{r['status']}: " + ((r["error_tail"] or "").strip().splitlines()[-1:] or [""])[0][:200]
                    continue
                if r["busy"] and r["cell_id"] in clean:
                    continue  # set aside as the views do: the cell has runs that started idle
                ev.ok += 1
                if r["v"] is not None:
                    ev.values.append(float(r["v"]))
                if r["accuracy"] is not None:
                    ev.accuracies.append(float(r["accuracy"]))
            self.cache.update(found)
        return {c: self.cache[c] for c in cell_ids if c in self.cache}


class _Store:
    """The tuning's trials in the warehouse (``tuning_trials``) and its row (``tunings``)."""

    def __init__(self, warehouse: Path, tid: str, row: dict[str, Any], tunings: Any) -> None:
        self.warehouse, self.tid, self.row, self.t = warehouse, tid, row, tunings
        self._earlier: list[dict[str, Any]] = []
        try:
            with reader(warehouse) as con:
                found = tunings.read_tunings(con, tid)
        except NotAWarehouse:
            found = []
        if found:
            self.row["started_at"] = found[0]["started_at"]
            self._earlier = found[0]["trials"]

    def trials(self) -> list[dict[str, Any]]:
        return list(self._earlier)

    def add(self, trial: dict[str, Any]) -> None:
        self.t.add_trial(self.warehouse, self.tid, trial)

    def save(self, status: str, summary: dict[str, Any] | None) -> None:
        self.t.save_tuning(self.warehouse, {**self.row, "status": status, "summary": summary})


def _print(tid: str, s: dict[str, Any]) -> None:
    unit = s["unit"]
    table = Table(title=f"tuning {tid}: {s['objective']} ({unit}), best configuration per framework against its "
                        "default")
    for col in ("framework", "default", "best", "changes", "runs D/B", "speedup", "p", "acc Δ pts", "verdict"):
        table.add_column(col, overflow="fold")
    for a in s["answer"]:
        d, b, c = a["default"] or {}, a["best"] or {}, a["comparison"]
        acc = (f"{(b['accuracy'] - d['accuracy']) * 100:+.2f}" if b.get("accuracy") is not None
               and d.get("accuracy") is not None else "-")
        table.add_row(a["framework"], f"{fmt_num(d.get('median'))} ({d.get('cell_id') or '-'})",
                      f"{fmt_num(b.get('median'))} ({b.get('cell_id') or '-'})", ", ".join(a["changes"]) or "-",
                      f"{d.get('runs', 0)}/{b.get('runs', 0)}",
                      fmt_ratio_ci(c.get("ratio"), c.get("ratio_low"), c.get("ratio_high"), 0.95) if c else "-",
                      fmt_p(c.get("p_value")) if c else "-", acc, a["verdict"])
    out.print(table)
    for a in s["answer"]:
        for note in a.get("noise") or []:
            out.print(f"note ({a['framework']}): {note}", markup=False, soft_wrap=True)
    for fw, imp in s["importance"].items():
        out.print(f"importance ({fw}): " + ", ".join(f"{k} {v:.2f}" for k, v in imp.items()), markup=False)
    t = s["trials"]
    out.print(f"{s['runs']} runs in {duration_text(s['seconds'])}; trials: {t['ok']} ok, {t['infeasible']} "
              f"infeasible, {t['failed']} failed, {t['refused']} refused at plan time; stopped: "
              f"{s['stopped_because'] or 'done'}", markup=False, soft_wrap=True)
