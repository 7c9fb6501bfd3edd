"""How often does a verdict err, and how often does it find a real difference? The false-positive
rate and power of matrun's comparisons for fixed and adaptive repeats (issue 27), measured by
resampling real runs of this host and on synthetic cases.

For each design (fixed 4, fixed 8, adaptive 4..8, adaptive 4..12; runner/planning/sequential.py)
and each case, ``--draws`` comparisons of two cells are run through the procedure the sweep and
the warehouse use: each look adds one run per side; a fixed design decides at its one look with
p < 0.05, an adaptive one at the first look with p <= its level (its p-values computed as the
warehouse's ``compare_samples`` computes them).  A/A: both cells draw from the same
distribution (the same cell under two names): every call is a false positive.  Power at 1.1x,
1.3x and 2x: one cell's values are multiplied by the ratio; power counts calls in the right
direction.  ``repeats`` is the mean repeats per side the procedure used (A/A and at 1.3x).
Adaptive designs stop adding repeats to a comparison judged futile, as the sweep does
(``sequential.futile``); the rows marked ``nofut`` show the same design without that rule.

Cases:
- ``real``: the throughputs of every cell of ``--warehouse`` (a matrun warehouse, read-only)
  with at least ``--min-runs`` ok runs; each draw picks a cell and resamples its values with
  replacement for both sides (a tiny multiplicative jitter, 1e-9, breaks the ties resampling
  makes, as a continuous measurement would; ties broken at random keep the test exact);
- ``cv 2 %`` .. ``cv 20 %``: log-normal throughputs with that coefficient of variation;
- ``busy 1 in 4``: log-normal with CV 3 %, each run 1 in 4 times 1.4x slower (a run that
  shared the machine: what a noisy host does to a fixed 4-against-4 comparison).

    .venv/bin/python benchmarks/sequential_error.py --warehouse matrun.duckdb [--draws 2000]

Prints one table; measured output is kept in benchmarks/measured/ and docs/SEQUENTIAL.md.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import subprocess
import sys
import json
from pathlib import Path
from typing import Callable

from matrun.runner.planning.sequential import (
    ALPHA, FUTILITY_FROM, Design, design, futile, p_value, ratio_interval,
)

Gen = Callable[[random.Random], float]


def run_once(d: Design, gx: Gen, gy: Gen, rng: random.Random, give_up: bool = True) -> tuple[int, int]:
    """One comparison through design ``d``: (+1 / -1 called x larger / smaller, 0 undecided;
    repeats per side used).  ``give_up``: an adaptive design stops adding repeats to a
    comparison judged futile (``sequential.futile`` on its Hodges-Lehmann interval), as the
    sweep does."""
    xs: list[float] = []
    ys: list[float] = []
    u = 0.0
    for k in range(1, d.max + 1):
        x, y = gx(rng), gy(rng)
        u += bisect.bisect_left(ys, x) + (len(xs) - bisect.bisect_right(xs, y)) + (1.0 if x > y else 0.0)
        bisect.insort(xs, x)
        bisect.insort(ys, y)
        if k < d.min:
            continue
        p = p_value(u, k, k)
        called = p < ALPHA if not d.adaptive else p <= d.level + 1e-12
        if called:
            return (1 if u > k * k / 2 else -1), k
        if d.adaptive and give_up and k >= FUTILITY_FROM:
            interval = ratio_interval(xs, ys)
            if interval is not None and futile(interval[0], interval[1], k, d.max, d.level):
                return 0, k
    return 0, d.max


def lognormal(cv: float, scale: float = 1.0) -> Gen:
    sigma = math.sqrt(math.log1p(cv * cv))
    return lambda rng: scale * math.exp(rng.gauss(0.0, sigma))


def busy(scale: float = 1.0) -> Gen:
    base = lognormal(0.03)
    return lambda rng: base(rng) * scale / (1.4 if rng.random() < 0.25 else 1.0)


def resampled(values: list[float], scale: float = 1.0) -> Gen:
    return lambda rng: scale * rng.choice(values) * (1.0 + 1e-9 * rng.gauss(0.0, 1.0))


def real_cells(warehouse: Path, min_runs: int) -> list[list[float]]:
    """Every cell's throughput values with at least ``min_runs`` of them (via ``matrun query``)."""
    matrun = Path(sys.executable).with_name("matrun")
    done = subprocess.run([str(matrun), "query", "--warehouse", str(warehouse), "--format", "json",
                           f"SELECT throughput_values FROM cell_stats WHERE throughput_n >= {int(min_runs)}"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"matrun query failed: {done.stderr.strip()}")
    return [[float(v) for v in row["throughput_values"]] for row in json.loads(done.stdout)]


def measure(d: Design, make: Callable[[float], tuple[Gen, Gen]], draws: int, seed: int,
            give_up: bool = True) -> dict[str, float]:
    """FPR (A/A), power at 1.1 / 1.3 / 2, mean repeats (A/A, 1.3x) of design ``d``."""
    out: dict[str, float] = {}
    for ratio in (1.0, 1.1, 1.3, 2.0):
        rng = random.Random(f"{seed}-{d.min}-{d.max}-{ratio}")
        calls = right = used = 0
        for _ in range(draws):
            gx, gy = make(ratio)
            sign, k = run_once(d, gx, gy, rng, give_up)
            used += k
            calls += sign != 0
            right += sign > 0
        if ratio == 1.0:
            out["fpr"], out["repeats_aa"] = calls / draws, used / draws
        else:
            out[f"power_{ratio:g}"] = right / draws
            if ratio == 1.3:
                out["repeats_13"] = used / draws
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warehouse", type=Path, action="append", default=[],
                    help="a matrun warehouse whose cells' throughputs are resampled (repeatable)")
    ap.add_argument("--min-runs", type=int, default=5, help="a real cell needs this many ok runs (default 5)")
    ap.add_argument("--draws", type=int, default=2000, help="comparisons per design, case and effect")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    cases: list[tuple[str, Callable[[float], tuple[Gen, Gen]]]] = []
    pools = [values for w in args.warehouse for values in real_cells(w, args.min_runs)]
    if pools:
        pick = random.Random(args.seed)

        def real(ratio: float) -> tuple[Gen, Gen]:
            values = pick.choice(pools)
            return resampled(values, ratio), resampled(values)

        cvs = sorted(statistics_cv(v) for v in pools)
        cases.append((f"real ({len(pools)} cells, CV {cvs[0]:.0%}-{cvs[-1]:.0%})", real))
    for cv in (0.02, 0.05, 0.10, 0.20):
        cases.append((f"cv {cv:.0%}", lambda r, cv=cv: (lognormal(cv, r), lognormal(cv))))
    cases.append(("busy 1 in 4", lambda r: (busy(r), busy())))

    designs = [design(4, 4), design(8, 8), design(4, 8), design(4, 12)]
    print(f"matrun sequential_error: {args.draws} comparisons per design, case and effect; seed {args.seed}")
    print("designs: " + "; ".join(
        f"{'fixed ' + str(d.min) if not d.adaptive else f'adaptive {d.min}..{d.max}'}: level "
        f"{(ALPHA if not d.adaptive else d.level):.4f}" for d in designs))
    header = f"{'case':<34} {'design':<15} {'FPR':>6} {'1.1x':>6} {'1.3x':>6} {'2x':>6} {'rep A/A':>8} {'rep 1.3x':>8}"
    print(header)
    print("-" * len(header))
    runs = [(d, True) for d in designs] + [(d, False) for d in designs if d.adaptive]
    for name, make in cases:
        for d, give_up in runs:
            m = measure(d, make, args.draws, args.seed, give_up)
            label = (f"fixed {d.min}" if not d.adaptive else f"adaptive {d.min}..{d.max}"
                     + ("" if give_up else " nofut"))
            print(f"{name:<34} {label:<15} {m['fpr']:>6.3f} {m['power_1.1']:>6.3f} {m['power_1.3']:>6.3f} "
                  f"{m['power_2']:>6.3f} {m['repeats_aa']:>8.2f} {m['repeats_13']:>8.2f}")
    se = math.sqrt(ALPHA * (1 - ALPHA) / args.draws)
    print(f"(a false-positive rate of 0.05 measured over {args.draws} draws has a standard error of {se:.4f})")


def statistics_cv(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean


if __name__ == "__main__":
    main()
