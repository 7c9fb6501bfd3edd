"""What DuckDB's signature check of matrun's two extensions costs each DuckDB instance matrun
opens a lake in (warehouse/catalog.py LAKE_CONFIG).  Run from the repository root:

    python benchmarks/extension_load.py [--processes 6]

In each of PROCESSES fresh Python processes (a process's first LOAD of a file is the one a
matrun command pays), alternating which goes first, it times the two LOADs of a local lake
(ducklake, sqlite_scanner) in a plain ``duckdb.connect()`` (signature checked) and in
``catalog.lake_connect()`` (LAKE_CONFIG: the check skipped), then an ``open_warehouse`` of an
empty warehouse read-only both ways.  It prints the medians and their ratio, measured side by
side in one run.  Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path
import duckdb
from matrun.warehouse import catalog, db
signed = sys.argv[1] == "signed"
connect = duckdb.connect if signed else catalog.lake_connect
con = connect()
started = time.perf_counter()
for name in ("ducklake", "sqlite_scanner"):
    con.execute(f"LOAD '{catalog.extension_path(name)}'")
load = time.perf_counter() - started
con.close()
catalog.lake_connect = connect  # the warehouse's own open, with or without the check
started = time.perf_counter()
with db.open_warehouse(Path(sys.argv[2]), read_only=True) as wh:
    wh.con.execute("SELECT count(*) FROM runs").fetchone()
print(json.dumps({"load": load, "open": time.perf_counter() - started}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    args = parser.parse_args()
    from matrun.warehouse.ingest import ingest

    with tempfile.TemporaryDirectory() as tmp:
        warehouse = Path(tmp) / "w.duckdb"
        ingest([], warehouse=warehouse)
        times: dict[str, dict[str, list[float]]] = {"signed": {"load": [], "open": []},
                                                    "lake_config": {"load": [], "open": []}}
        for i in range(args.processes):
            order = ("signed", "lake_config") if i % 2 == 0 else ("lake_config", "signed")
            for mode in order:
                out = subprocess.run([sys.executable, "-c", CHILD, "signed" if mode == "signed" else "x",
                                      str(warehouse)], capture_output=True, text=True, check=True).stdout
                for key, value in json.loads(out.splitlines()[-1]).items():
                    times[mode][key].append(value)
    for key, what in (("load", "LOAD of ducklake + sqlite_scanner"), ("open", "open_warehouse, read-only")):
        signed, skipped = (statistics.median(times[m][key]) for m in ("signed", "lake_config"))
        print(f"{what}: signature checked {signed * 1000:.0f} ms, LAKE_CONFIG {skipped * 1000:.0f} ms "
              f"(ratio {signed / skipped:.1f}x, median of {args.processes} processes each)")


if __name__ == "__main__":
    main()
