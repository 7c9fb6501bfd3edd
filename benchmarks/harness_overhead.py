"""Harness overhead: LeNet-5 training throughput through `matrun sweep` (monitor on) divided
by the same training loop run bare (benchmarks/bare_lenet.py) in the same virtual
environment, same threads, same batch, same number of steps; side by side, in alternating
order, N pairs.  Prints each pair and the median ratio (target ≥ 0.98).

    python benchmarks/harness_overhead.py [--pairs 5] [--threads 1] [--batch 64] [--steps 600]

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
from pathlib import Path

from matrun.runner.environments.venvs import ensure_env
from matrun.runner.datasets.staging import default_data_dir
from matrun.warehouse.db import open_warehouse

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


def through_sweep(workdir: Path) -> float:
    subprocess.run([MATRUN, "sweep", "--force"], cwd=workdir, check=True, capture_output=True)
    with open_warehouse(workdir / "matrun.duckdb", read_only=True) as wh:
        return wh.con.execute("SELECT throughput FROM runs ORDER BY ingested_at DESC LIMIT 1").fetchone()[0]


def bare(python: Path, data: Path, threads: int, batch: int, steps: int, warmup: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    out = subprocess.run([str(python), str(HERE / "bare_lenet.py"), str(data), str(threads), str(batch),
                          str(steps), str(warmup)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["throughput"]


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
    ratios, sweeps, bares = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "matrix.toml").write_text(MATRIX.format(data=a.data, steps=a.steps, warmup=a.warmup,
                                                        batch=a.batch, threads=a.threads))
        print(f"LeNet-5, Fashion-MNIST, threads {a.threads}, batch {a.batch}, {a.steps} steps ({a.warmup} warm-up)")
        print(f"{'pair':>4} {'order':>12} {'sweep img/s':>12} {'bare img/s':>11} {'ratio':>7}")
        for pair in range(a.pairs):
            if pair % 2 == 0:
                s = through_sweep(work)
                b = bare(python, a.data, a.threads, a.batch, a.steps, a.warmup)
            else:
                b = bare(python, a.data, a.threads, a.batch, a.steps, a.warmup)
                s = through_sweep(work)
            ratios.append(s / b)
            sweeps.append(s)
            bares.append(b)
            order = "sweep,bare" if pair % 2 == 0 else "bare,sweep"
            print(f"{pair + 1:>4} {order:>12} {s:>12.0f} {b:>11.0f} {s / b:>7.3f}")
    print(f"median ratio sweep/bare over {a.pairs} pairs: {statistics.median(ratios):.3f} (target >= 0.98)")
    # On this VM a training process lands in one of two speed modes (about 8.0k or 10.8k img/s
    # for threads 1, batch 64), bare loop and harness alike; a pair that straddles the modes
    # says nothing about the harness.  Best-of-N compares the fast modes of both sides.
    print(f"best-of-{a.pairs} ratio sweep/bare: {max(sweeps) / max(bares):.3f}; "
          f"ratio of medians: {statistics.median(sweeps) / statistics.median(bares):.3f}")


if __name__ == "__main__":
    main()
