"""Synthetic data speed: matrun's seeded synthetic ImageNet-sized set (3×224×224, 1,000
classes; runner/harness/datasets.py ``synthetic``) against ``os.urandom`` of the same number of
bytes, side by side in one process, alternating, N rounds.  The harness makes the set inside
every synthetic cell before its first step, so its cost is part of a cell's wall time (not of
its throughput); a ratio near 1 means the generator is as cheap as producing the bytes at all.

    python benchmarks/synthetic_data.py [--rounds 3] [--train 512] [--test 64]

Output: per round both times, then the median ratio (synthetic / urandom).  Moved here from a
timed assertion in tests/test_datasets.py (a test must not depend on the machine's speed).
Do not take timings while the machine is busy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from matrun.runner.harness import datasets as data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--test", type=int, default=64)
    args = parser.parse_args()
    shape = (3, 224, 224)
    size = (args.train + args.test) * shape[0] * shape[1] * shape[2]
    ratios = []
    for rnd in range(args.rounds):
        t0 = time.perf_counter()
        ds = data.synthetic(shape, classes=1000, train=args.train, test=args.test, seed=rnd)
        synthetic_s = time.perf_counter() - t0
        assert len(ds.train.images) + len(ds.test.images) == size
        t0 = time.perf_counter()
        raw = os.urandom(size)
        urandom_s = time.perf_counter() - t0
        assert len(raw) == size
        ratios.append(synthetic_s / urandom_s)
        print(f"round {rnd + 1}: synthetic {synthetic_s:.2f} s, urandom {urandom_s:.2f} s "
              f"({size / 2**20:.0f} MiB), ratio {ratios[-1]:.2f}")
    print(f"median ratio synthetic/urandom over {args.rounds} rounds: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
