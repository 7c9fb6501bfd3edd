"""What a read of a warehouse costs when this process already has its reader instance, with the
schema and view checks made once per instance (warehouse/db.py ``_CHECKED``) and on every open
(as before).  Run from the repository root:

    python benchmarks/reader_checks.py [--reads 40] [--rounds 3]

Builds a warehouse of 12 fabricated runs (tests/bundle_factory.py), then, in ROUNDS rounds that
alternate which way goes first, times READS ``run_query("SELECT * FROM cell_stats")`` calls each
way in this one process (the instance pinned to the same snapshot throughout), in CPU seconds
(process time) and wall seconds.  Prints the medians per read and their ratio, measured side by
side in one run.  Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from bundle_factory import make_bundle  # noqa: E402
from matrun.warehouse import db  # noqa: E402
from matrun.warehouse.ingest import ingest  # noqa: E402
from matrun.warehouse.query import run_query  # noqa: E402


class _Forgetful(dict):
    """A ``_CHECKED`` that never remembers: every open checks again (the old behaviour)."""

    def __setitem__(self, key, value) -> None:
        pass


def _reads(warehouse: Path, reads: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(reads):
        run_query("SELECT * FROM cell_stats", warehouse=warehouse)
    return (time.process_time() - cpu) / reads, (time.perf_counter() - wall) / reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="matrun-bench-") as tmp:
        results, warehouse = Path(tmp) / "results", Path(tmp) / "w.duckdb"
        for cell in range(4):
            for repeat in range(3):
                make_bundle(results, cell_id=f"c0ffee000000000{cell}", repeat=repeat,
                            params={"threads": cell + 1})
        ingest([results], warehouse=warehouse)
        run_query("SELECT 1", warehouse=warehouse)  # the instance, made once
        once, every = db._CHECKED, _Forgetful()
        samples: dict[str, list[tuple[float, float]]] = {"once per instance": [], "on every open": []}
        for round_ in range(args.rounds):
            order = [("once per instance", once), ("on every open", every)]
            for name, checked in (order if round_ % 2 == 0 else order[::-1]):
                db._CHECKED = checked
                samples[name].append(_reads(warehouse, args.reads))
        db._CHECKED = once
    medians = {name: (statistics.median(c for c, _ in s), statistics.median(w for _, w in s))
               for name, s in samples.items()}
    for name, (cpu, wall) in medians.items():
        print(f"{name:>18}: {cpu * 1000:7.1f} ms CPU, {wall * 1000:7.1f} ms wall per read")
    new, old = medians["once per instance"], medians["on every open"]
    print(f"ratio (every open / once): CPU {old[0] / new[0]:.2f}x, wall {old[1] / new[1]:.2f}x "
          f"({args.rounds} rounds of {args.reads} reads)")


if __name__ == "__main__":
    main()
