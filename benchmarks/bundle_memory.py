"""How much memory does reading one large bundle take?  Run from the repository root:

    python benchmarks/bundle_memory.py [--mb 500] [--tmp /tmp]

It writes one bundle whose events.jsonl is about MB megabytes of step records, formatted as
the harness writes them (the bundle limit is 512 MiB), into a temporary directory under TMP
(deleted afterwards: mind the disk), then reads it in a fresh process —
``load_bundle`` and ``rows.bundle_tables``, what ingest does before it writes — and prints
the file's size, the process's peak resident memory (before reading and at its peak) and
the time taken; then the same for a whole ``matrun ingest`` of the bundle into a new
warehouse (reading, the Arrow tables and DuckDB writing them as Parquet), in another fresh
process.  The bundle is made by ``tests/bundle_factory.py``, whose events.jsonl is
then grown with step lines: this script puts the repository's ``tests/`` folder on
``sys.path`` to import it, so run it from a checkout with matrun installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bundle_factory import make_bundle  # noqa: E402

# Run in a fresh process, so its peak resident memory is this bundle's alone.
_INGEST = """
import json, resource, sys, time
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest
with open_warehouse(sys.argv[2]):  # created, extensions loaded: not part of the measure
    pass
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
report = ingest([sys.argv[1]], warehouse=sys.argv[2])
seconds = time.perf_counter() - start
assert len(report.ingested) == 1, report.summary()
with open_warehouse(sys.argv[2], read_only=True) as wh:
    steps = wh.con.execute("SELECT count(*) FROM steps").fetchone()[0]
print(json.dumps({"steps": steps, "seconds": seconds, "before": before,
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

_READ = """
import json, resource, sys, time
from matrun.warehouse.bundles.read import load_bundle
from matrun.warehouse.rows import bundle_tables
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
tables = bundle_tables(load_bundle(sys.argv[1]))
seconds = time.perf_counter() - start
print(json.dumps({"steps": tables["steps"].num_rows, "seconds": seconds, "before": before,
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def grow_events(path: Path, megabytes: int) -> int:
    """Append step records to events.jsonl, before its epoch, summary and end records, until
    it holds ``megabytes`` MiB; return the number of steps written."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    head = [line for line in lines if json.loads(line)["type"] in ("header", "probe", "data", "model")]
    tail = [line for line in lines if json.loads(line)["type"] in ("epoch", "summary", "end")]
    steps = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(head)
        while fh.tell() < megabytes * 2**20:
            fh.write("".join(
                json.dumps({"type": "step", "epoch": 0, "step": steps + n,
                            "phase": "warmup" if steps + n < 10 else "timed",
                            "seconds": 0.0123456789 + (steps + n) * 1e-9, "images": 64}) + "\n"
                for n in range(100_000)))
            steps += 100_000
        fh.writelines(tail)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500, help="size of events.jsonl in MiB")
    parser.add_argument("--tmp", type=Path, default=None, help="where to write the bundle")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="matrun-bundle-memory-", dir=args.tmp) as tmp:
        bundle = make_bundle(Path(tmp) / "results")
        grow_events(bundle / "events.jsonl", args.mb)
        size = (bundle / "events.jsonl").stat().st_size
        out = subprocess.run([sys.executable, "-c", _READ, str(bundle)], capture_output=True,
                             text=True, check=True)
        result = json.loads(out.stdout)
        out = subprocess.run([sys.executable, "-c", _INGEST, str(bundle), str(Path(tmp) / "w.duckdb")],
                             capture_output=True, text=True, check=True)
        whole = json.loads(out.stdout)

    mib = 2**20
    print(f"events.jsonl: {size / mib:.0f} MiB, {result['steps']:,} steps")
    print(f"read + tables: {result['seconds']:.2f} s; peak RSS {result['peak'] / mib:.0f} MiB "
          f"({result['before'] / mib:.0f} MiB before reading) = "
          f"{result['peak'] / size:.2f} x the file")
    print(f"matrun ingest into a warehouse: {whole['steps']:,} steps in {whole['seconds']:.2f} s; "
          f"peak RSS {whole['peak'] / mib:.0f} MiB ({whole['before'] / mib:.0f} MiB before) = "
          f"{whole['peak'] / size:.2f} x the file")


if __name__ == "__main__":
    main()
