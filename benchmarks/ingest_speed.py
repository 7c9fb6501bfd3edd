"""How fast does `matrun ingest` load bundles?  Run from the repository root:

    python benchmarks/ingest_speed.py [--bundles 100] [--steps 1000]

It writes BUNDLES fabricated bundles of STEPS steps each into a temporary directory, ingests
them into a fresh warehouse, then ingests them again (every bundle unchanged), and prints
the times.  The bundles are made by ``tests/bundle_factory.py`` (the same factory the tests
use, which writes the exact on-disk format through ``matrun.warehouse.bundles.write``): this script puts
the repository's ``tests/`` folder on ``sys.path`` to import it, so run it from a checkout with
matrun installed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bundle_factory import make_bundle  # noqa: E402

from matrun.warehouse.db import open_warehouse  # noqa: E402
from matrun.warehouse.ingest import ingest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=100)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="matrun-ingest-speed-") as tmp:
        results, warehouse = Path(tmp) / "results", Path(tmp) / "bench.duckdb"
        seconds = [0.02] * 10 + [0.01] * (args.steps - 10)
        start = time.perf_counter()
        for i in range(args.bundles):
            make_bundle(results, cell_id=f"{i // 5:016x}", repeat=i % 5,
                        step_seconds=seconds, warmup_steps=10,
                        monitor=[(0.2 * k, 100.0, 5.0, 0.0, 10**8) for k in range(1, 151)])
        generate_s = time.perf_counter() - start

        start = time.perf_counter()
        report = ingest([results], warehouse=warehouse)
        ingest_s = time.perf_counter() - start

        start = time.perf_counter()
        again = ingest([results], warehouse=warehouse)
        again_s = time.perf_counter() - start

        with open_warehouse(warehouse, read_only=True) as wh:
            steps = wh.con.execute("SELECT count(*) FROM steps").fetchone()[0]
        size_mb = warehouse.stat().st_size / 2**20

    print(f"generated {args.bundles} bundles x {args.steps} steps in {generate_s:.2f} s")
    print(f"ingest:     {len(report.ingested)} bundles, {steps} steps in {ingest_s:.2f} s "
          f"= {len(report.ingested) / ingest_s:.0f} bundles/s, {steps / ingest_s:,.0f} steps/s")
    print(f"re-ingest:  {len(again.unchanged)} unchanged in {again_s:.2f} s "
          f"= {len(again.unchanged) / again_s:.0f} bundles/s")
    print(f"warehouse file: {size_mb:.1f} MiB")


if __name__ == "__main__":
    main()
