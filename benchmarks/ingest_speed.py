"""How fast does `matrun ingest` load bundles, against DuckDB loading the same rows itself?
Run from the repository root:

    python benchmarks/ingest_speed.py [--bundles 100] [--steps 10000] [--repeats 3]

It writes BUNDLES fabricated bundles of STEPS steps each into a temporary directory (made by
``tests/bundle_factory.py``, the tests' factory, which writes the exact on-disk format through
``matrun.warehouse.bundles.write``: this script puts the repository's ``tests/`` folder on
``sys.path`` to import it, so run it from a checkout with matrun installed).  Then, REPEATS
times, side by side in this one process:

- ``matrun ingest``: every bundle read, validated and loaded into a fresh warehouse;
- a plain DuckDB bulk load of the same step rows: ``read_json`` over the same events.jsonl
  files, the step records kept, into a table of a fresh DuckDB file — DuckDB's own parser
  and writer, with no validation, no digest and no other table;
- ``matrun ingest`` again over the same bundles (every one unchanged: recognised by its stat
  fingerprint, nothing read).

It prints the median of each, rows per second and the ratio of the ingest to the plain load.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bundle_factory import make_bundle  # noqa: E402

from matrun.warehouse.db import forget_instances, open_warehouse  # noqa: E402
from matrun.warehouse.ingest import ingest  # noqa: E402


def plain_load(results: Path, out: Path) -> int:
    """DuckDB's own bulk load of the step records of every events.jsonl under ``results``."""
    con = duckdb.connect(str(out))
    try:
        pattern = str(results / "**" / "events.jsonl").replace("'", "''")
        con.execute(
            "CREATE TABLE steps AS SELECT filename AS run, epoch::INTEGER AS epoch, "
            "step::INTEGER AS step, phase, seconds::DOUBLE AS seconds, images::INTEGER AS images "
            f"FROM read_json('{pattern}', format = 'newline_delimited', filename = true, "
            "union_by_name = true, maximum_object_size = 1048576) WHERE type = 'step'")
        return con.execute("SELECT count(*) FROM steps").fetchone()[0]
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="matrun-ingest-speed-") as tmp:
        work, results = Path(tmp), Path(tmp) / "results"
        seconds = [0.02] * 10 + [0.01] * (args.steps - 10)
        start = time.perf_counter()
        for i in range(args.bundles):
            make_bundle(results, cell_id=f"{i // 5:016x}", repeat=i % 5,
                        step_seconds=seconds, warmup_steps=10,
                        monitor=[(0.2 * k, 100.0, 5.0, 0.0, 10**8) for k in range(1, 151)])
        print(f"generated {args.bundles} bundles x {args.steps} steps in "
              f"{time.perf_counter() - start:.2f} s")
        with open_warehouse(work / "warm.duckdb"):  # extensions and template made once, not timed
            pass

        ingest_s, plain_s, again_s = [], [], []
        steps = plain_rows = 0
        for n in range(args.repeats):
            warehouse, plain = work / f"bench-{n}.duckdb", work / f"plain-{n}.duckdb"
            start = time.perf_counter()
            report = ingest([results], warehouse=warehouse)
            ingest_s.append(time.perf_counter() - start)
            assert len(report.ingested) == args.bundles, report.summary()

            start = time.perf_counter()
            plain_rows = plain_load(results, plain)
            plain_s.append(time.perf_counter() - start)

            start = time.perf_counter()
            again = ingest([results], warehouse=warehouse)
            again_s.append(time.perf_counter() - start)
            assert len(again.unchanged) == args.bundles, again.summary()

            with open_warehouse(warehouse, read_only=True) as wh:
                steps = wh.con.execute("SELECT count(*) FROM steps").fetchone()[0]
            forget_instances(warehouse)
            shutil.rmtree(warehouse)
            plain.unlink()

    assert steps == plain_rows == args.bundles * args.steps, (steps, plain_rows)
    ingest_m, plain_m, again_m = (statistics.median(x) for x in (ingest_s, plain_s, again_s))
    print(f"matrun ingest:     {steps:,} step rows in {ingest_m:.2f} s = {steps / ingest_m:,.0f} rows/s "
          f"(median of {args.repeats}: {', '.join(f'{s:.2f}' for s in ingest_s)})")
    print(f"plain DuckDB load: {plain_rows:,} step rows in {plain_m:.2f} s = {plain_rows / plain_m:,.0f} rows/s "
          f"({', '.join(f'{s:.2f}' for s in plain_s)})")
    print(f"ratio ingest / plain load: {ingest_m / plain_m:.2f}")
    print(f"re-ingest, all unchanged: {args.bundles} bundles in {again_m:.3f} s "
          f"({', '.join(f'{s:.3f}' for s in again_s)})")


if __name__ == "__main__":
    main()
