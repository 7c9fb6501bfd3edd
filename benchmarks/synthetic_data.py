"""Synthetic data speed: matrun's seeded synthetic ImageNet-sized set (3×224×224, 1,000
classes; runner/harness/datasets.py ``synthetic``) made by its two paths — the standard
library's (an environment without numpy) and numpy's (every framework image) — and
``os.urandom`` of the same number of bytes, side by side in one process, alternating, N rounds.
The harness makes the set inside every synthetic cell before its first step, so its cost is
part of a cell's wall time (not of its throughput).  Both paths make the same bytes
(tests/test_datasets.py); the default size is the GPU cells' of issue 26 (1,536 training and
256 test images).

    python benchmarks/synthetic_data.py [--rounds 3] [--train 1536] [--test 256] [--no-stdlib]

Output: per round the three times, then the medians and the ratios stdlib/numpy and
numpy/urandom.  Needs numpy (`pip install '.[test]'` has it).  Do not take timings while the
machine is busy.
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
    parser.add_argument("--train", type=int, default=1536)
    parser.add_argument("--test", type=int, default=256)
    parser.add_argument("--no-stdlib", action="store_true", help="time numpy's path and urandom only")
    args = parser.parse_args()
    shape = (3, 224, 224)
    size = (args.train + args.test) * shape[0] * shape[1] * shape[2]
    times: dict[str, list[float]] = {"stdlib": [], "numpy": [], "urandom": []}
    for rnd in range(args.rounds):
        for path in ("numpy", "stdlib"):
            if path == "stdlib" and args.no_stdlib:
                continue
            t0 = time.perf_counter()
            ds = data.synthetic(shape, classes=1000, train=args.train, test=args.test, seed=rnd,
                                use_numpy=path == "numpy")
            times[path].append(time.perf_counter() - t0)
            assert len(ds.train.images) + len(ds.test.images) == size
            del ds
        t0 = time.perf_counter()
        raw = os.urandom(size)
        times["urandom"].append(time.perf_counter() - t0)
        assert len(raw) == size
        del raw
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items() if v)
              + f" ({size / 2**20:.0f} MiB)")
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print("median: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    if "stdlib" in med:
        print(f"stdlib/numpy: {med['stdlib'] / med['numpy']:.1f}x")
    print(f"numpy/urandom: {med['numpy'] / med['urandom']:.2f}")


if __name__ == "__main__":
    main()
