"""Are readers ever locked out of the warehouse, or writers failed by readers?  Run from the
repository root:

    python benchmarks/warehouse_readers.py [--bundles 600] [--steps 1000] [--poll-ms 50]

It writes BUNDLES fabricated bundles (``tests/bundle_factory.py``, the tests' factory) and
ingests them twice over, into a fresh warehouse each time: once in one ``ingest`` call (one
long transaction), once one bundle per call (as a sweep ingests after each cell).  Meanwhile,
in other processes:

- a plain DuckDB client polls every POLL_MS: it opens the warehouse as any client would (its
  ``attach.sql``; a single-file warehouse of an older matrun: the file, read-only), checks
  that every run it sees has all its steps (``steps = runs × STEPS``: a half-ingested state
  would break it), and closes;
- another plain client holds the warehouse open, reading now and then, for the whole ingest
  (``--no-holder``: none);
- ``matrun query`` runs in a loop.

It prints, for each ingest, how many reader opens were refused, how many saw an
inconsistent state, how many ``matrun query`` calls failed and whether the ingest failed.
The same script measures an older matrun (its warehouse a single DuckDB file) for the before
numbers: install that matrun in another environment and run this file with its Python.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bundle_factory import make_bundle  # noqa: E402

from matrun.warehouse.ingest import ingest  # noqa: E402

_OPEN = """
import sys
import time
from pathlib import Path
import duckdb

def open_plain(path):
    path = Path(path)
    if path.is_dir():  # a DuckLake warehouse: its attach.sql
        con = duckdb.connect()
        con.execute((path / "attach.sql").read_text())
        return con
    return duckdb.connect(str(path), read_only=True)  # a single-file warehouse
"""

_POLLER = _OPEN + """
path, steps, poll_s, stop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
opens = refused = inconsistent = 0
while not stop.exists():
    if not Path(path).exists():
        time.sleep(poll_s)
        continue
    opens += 1
    try:
        con = open_plain(path)
        try:
            runs, rows = con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps)").fetchone()
            inconsistent += rows != runs * steps
        finally:
            con.close()
    except duckdb.Error as exc:
        refused += 1
    time.sleep(poll_s)
print(opens, refused, inconsistent)
"""

_HOLDER = _OPEN + """
path, stop = sys.argv[1], Path(sys.argv[2])
while not Path(path).exists() and not stop.exists():
    time.sleep(0.05)
con = open_plain(path)
reads = 0
while not stop.exists():
    con.execute("SELECT count(*) FROM runs").fetchone()
    reads += 1
    time.sleep(0.2)
con.close()
print(reads)
"""

MATRUN = [sys.executable, "-m", "matrun.runner.cli.main"]


def run_case(results: Path, work: Path, name: str, one_call: bool, args: argparse.Namespace) -> None:
    warehouse = work / f"{name}.duckdb"
    stop = work / f"{name}.stop"
    # The warehouse exists (empty) before the readers start, as it does during a sweep.
    ingest([results / "first"], warehouse=warehouse)
    poller = subprocess.Popen([sys.executable, "-c", _POLLER, str(warehouse), str(args.steps),
                               str(args.poll_ms / 1000), str(stop)], stdout=subprocess.PIPE, text=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(warehouse), str(stop)],
                              stdout=subprocess.PIPE, text=True) if args.holder else None
    time.sleep(1.0)
    failures: list[str] = []
    queries = query_failures = 0
    start = time.perf_counter()
    bundles = sorted(p for p in (results / "many").rglob("0-1") if p.is_dir())
    chunks = [[results / "many"]] if one_call else [[b] for b in bundles]
    query = None
    for chunk in chunks:
        try:
            ingest(chunk, warehouse=warehouse)
        except Exception as exc:  # what a reader made the writer do is what is measured
            failures.append(str(exc).splitlines()[0][:200])
        if query is None or query.poll() is not None:
            if query is not None:
                queries += 1
                query_failures += query.returncode != 0
            query = subprocess.Popen([*MATRUN, "query", "SELECT count(*) FROM run_overview",
                                      "--warehouse", str(warehouse)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if query is not None:
        queries += 1
        query_failures += query.wait() != 0
    stop.write_text("")
    opens, refused, inconsistent = map(int, poller.communicate(timeout=120)[0].split())
    holder_out = holder.communicate(timeout=120)[0] if holder else ""
    held = ("none" if holder is None else
            f"read {holder_out.strip()} times" if holder.returncode == 0 else "failed")
    print(f"{name}: {len(chunks)} ingest call(s) in {seconds:.1f} s; plain-client opens every "
          f"{args.poll_ms} ms: {opens}, refused {refused}, inconsistent {inconsistent}; a client "
          f"holding it open: {held}; "
          f"matrun query: {queries} calls, {query_failures} failed; ingest failures: {len(failures)}"
          + (f" ({failures[0]})" if failures else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=600)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--poll-ms", type=int, default=50)
    parser.add_argument("--no-holder", dest="holder", action="store_false",
                        help="no client holding the warehouse open (an older matrun's ingest "
                             "fails at once with one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="matrun-readers-") as tmp:
        work = Path(tmp)
        results = work / "results"
        seconds = [0.02] * 10 + [0.01] * (args.steps - 10)
        make_bundle(results / "first", cell_id="f" * 16, step_seconds=seconds, warmup_steps=10)
        for i in range(args.bundles):
            make_bundle(results / "many", cell_id=f"{i:016x}", step_seconds=seconds, warmup_steps=10)
        os.environ.setdefault("MATRUN_HOME", str(work / "home"))
        run_case(results, work, "one-transaction", True, args)
        run_case(results, work, "one-call-per-bundle", False, args)


if __name__ == "__main__":
    main()
