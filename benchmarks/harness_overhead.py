"""Harness overhead: LeNet-5 training throughput through `matrun sweep` (monitor on) against
the same training loop run bare (benchmarks/bare_lenet.py) in the same virtual environment,
same threads, same batch, same number of steps; side by side, in alternating order, N pairs
(N processes on each side).  Compares like with like: on this VM a training process runs
its whole life in one of two speed modes (a LeNet-5 step at about 5 or about 8 ms,
../shared/DESIGN.md), so a sweep process in the fast mode next to a bare one in the slow
mode says nothing about the harness.

    python benchmarks/harness_overhead.py [--pairs 5] [--threads 1] [--batch 64] [--steps 600]

Output: one line per pair (its order; per side the throughput, the median timed step in ms
and the process's mode: fast, slow, or one), then, e.g. (numbers made up)

    modes: two, by the bimodality rule (warehouse/modes.py) over the 10 processes' median step
      times: fast 5.21 ms/step (6 processes), slow 8.30 ms/step (4); split at 6.75 ms
    sweep: 4 fast, 1 slow; bare: 2 fast, 3 slow
    like with like (sweep/bare, median throughput of each side's processes in the mode):
      fast: 0.994 (4 sweep, 2 bare processes)  target >= 0.98
      slow: 1.003 (1 sweep, 3 bare processes)
    pairs: median ratio over all 5 pairs, modes mixed: 1.212; over the 2 pairs whose sides
      share a mode: 0.997

(the first line is one line).  The modes come from every process's median timed step (the
sweep's from the warehouse's steps table, the bare loop's from its JSON line), pooled over
both sides; the fast mode is the shorter steps.  With "modes: one" (no two modes among the
step times, or fewer than four processes) the like-with-like line "one:" compares every
process.  A mode with processes of one side only gets "-" and says which side is missing;
when no mode has both sides the ratio is "not decidable" (run more pairs).  The paired median
mixes modes and is printed for reference only.  Do not take timings while the machine is busy.

Needs Debian's dataset-fashion-mnist (make data) and builds the torch environment if absent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from matrun.runner.environments.venvs import ensure_env
from matrun.runner.datasets.staging import default_data_dir
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.modes import two_modes

HERE = Path(__file__).resolve().parent
MATRUN = str(Path(sys.executable).with_name("matrun"))

MATRIX = """
[sweep]
name = "harness-overhead"
data_dir = "{data}"
[fixed]
dataset = "fashion-mnist"
iterations = {steps}
warmup_steps = {warmup}
batch_size = {batch}
threads = {threads}
lr = 0.01
momentum = 0.9
"""

# The latest run's throughput and median timed step (seconds), from the warehouse.
LATEST = """
SELECT r.throughput, median(s.seconds)
FROM runs AS r JOIN steps AS s USING (run_id)
WHERE s.phase = 'timed' AND r.run_id = (SELECT run_id FROM runs ORDER BY ingested_at DESC LIMIT 1)
GROUP BY r.throughput
"""


@dataclass(frozen=True)
class Process:
    """One training process: its side, throughput (images/s) and median timed step (s)."""

    side: str  # "sweep" | "bare"
    throughput: float
    step_s: float


def through_sweep(workdir: Path) -> Process:
    subprocess.run([MATRUN, "sweep", "--force"], cwd=workdir, check=True, capture_output=True)
    with open_warehouse(workdir / "matrun.duckdb", read_only=True) as wh:
        throughput, step_s = wh.con.execute(LATEST).fetchone()
    return Process("sweep", throughput, step_s)


def bare(python: Path, data: Path, threads: int, batch: int, steps: int, warmup: int) -> Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    out = subprocess.run([str(python), str(HERE / "bare_lenet.py"), str(data), str(threads), str(batch),
                          str(steps), str(warmup)], env=env, check=True, capture_output=True, text=True)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    return Process("bare", line["throughput"], line["step_seconds_median"])


def classify(processes: list[Process]) -> tuple[dict[int, str], list[str]]:
    """Each process's mode ("fast", "slow", or "one" when there are not two modes) by the
    bimodality rule over every process's median step time, and the lines that say so."""
    modes = two_modes([p.step_s for p in processes])
    if modes is None or not modes.bimodal:
        why = "fewer than four processes" if modes is None else "no two modes among the median step times"
        return {id(p): "one" for p in processes}, [f"modes: one ({why}, warehouse/modes.py)"]
    # step times: the low group is the fast mode
    fast = {id(p): "fast" if p.step_s < modes.threshold else "slow" for p in processes}
    lines = [f"modes: two, by the bimodality rule (warehouse/modes.py) over the {len(processes)} processes' "
             f"median step times: fast {1000 * modes.low_median:.2f} ms/step ({len(modes.low)} processes), "
             f"slow {1000 * modes.high_median:.2f} ms/step ({len(modes.high)}); split at "
             f"{1000 * modes.threshold:.2f} ms"]
    return fast, lines


def like_with_like(processes: list[Process], mode_of: dict[int, str]) -> list[str]:
    """Per mode, the sweep side's median throughput over the bare side's, from the processes
    in that mode only; "-" with the reason where a side has none."""
    lines = []
    counts = {side: {m: sum(1 for p in processes if p.side == side and mode_of[id(p)] == m)
                     for m in ("fast", "slow", "one")} for side in ("sweep", "bare")}
    if "one" not in mode_of.values():
        lines.append("; ".join(f"{side}: {counts[side]['fast']} fast, {counts[side]['slow']} slow"
                               for side in ("sweep", "bare")))
    lines.append("like with like (sweep/bare, median throughput of each side's processes in the mode):")
    decided = False
    for mode in ("fast", "slow", "one"):
        sides = {side: [p.throughput for p in processes if p.side == side and mode_of[id(p)] == mode]
                 for side in ("sweep", "bare")}
        if not sides["sweep"] and not sides["bare"]:
            continue
        if not sides["sweep"] or not sides["bare"]:
            missing = "sweep" if not sides["sweep"] else "bare"
            lines.append(f"  {mode}: - (no {missing} process in this mode)")
            continue
        ratio = statistics.median(sides["sweep"]) / statistics.median(sides["bare"])
        target = "  target >= 0.98" if mode in ("fast", "one") else ""
        counts_text = f"{len(sides['sweep'])} sweep, {len(sides['bare'])} bare processes"
        lines.append(f"  {mode}: {ratio:.3f} ({counts_text}){target}")
        decided = True
    if not decided:
        lines.append("  not decidable: no mode has processes of both sides; run more pairs")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--data", type=Path, default=default_data_dir())
    a = parser.parse_args()
    python = ensure_env("torch", "cpu").python
    pairs: list[tuple[str, Process, Process]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "matrix.toml").write_text(MATRIX.format(data=a.data, steps=a.steps, warmup=a.warmup,
                                                        batch=a.batch, threads=a.threads))
        print(f"LeNet-5, Fashion-MNIST, threads {a.threads}, batch {a.batch}, {a.steps} steps "
              f"({a.warmup} warm-up); {a.pairs} pairs in alternating order", flush=True)
        for pair in range(a.pairs):
            if pair % 2 == 0:
                s = through_sweep(work)
                b = bare(python, a.data, a.threads, a.batch, a.steps, a.warmup)
            else:
                b = bare(python, a.data, a.threads, a.batch, a.steps, a.warmup)
                s = through_sweep(work)
            pairs.append(("sweep,bare" if pair % 2 == 0 else "bare,sweep", s, b))
            print(f"  pair {pair + 1} done", flush=True)
    processes = [p for _, s, b in pairs for p in (s, b)]
    mode_of, mode_lines = classify(processes)
    print(f"{'pair':>4} {'order':>12} {'sweep img/s':>12} {'ms/step':>8} {'mode':>5} "
          f"{'bare img/s':>11} {'ms/step':>8} {'mode':>5} {'ratio':>7}")
    for i, (order, s, b) in enumerate(pairs, start=1):
        print(f"{i:>4} {order:>12} {s.throughput:>12,.0f} {1000 * s.step_s:>8.2f} {mode_of[id(s)]:>5} "
              f"{b.throughput:>11,.0f} {1000 * b.step_s:>8.2f} {mode_of[id(b)]:>5} {s.throughput / b.throughput:>7.3f}")
    for line in mode_lines + like_with_like(processes, mode_of):
        print(line)
    same = [s.throughput / b.throughput for _, s, b in pairs if mode_of[id(s)] == mode_of[id(b)]]
    print(f"pairs: median ratio over all {len(pairs)} pairs, modes mixed: "
          f"{statistics.median(s.throughput / b.throughput for _, s, b in pairs):.3f}; over the "
          f"{len(same)} pairs whose sides share a mode: "
          + (f"{statistics.median(same):.3f}" if same else "-"))


if __name__ == "__main__":
    main()
