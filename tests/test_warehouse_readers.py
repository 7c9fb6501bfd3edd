"""Any DuckDB client reads the warehouse at any moment, and never gets in a writer's way.

The clients here are not matrun: a bare ``duckdb`` Python connection running the warehouse's
``attach.sql`` (with ``pytz`` made unimportable: every table and view must come back without
it) and the DuckDB command-line client (``duckdb-cli`` from PyPI).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bundle_factory import make_bundle
from lake_client import client_env
from matrun.warehouse import maintenance
from matrun.warehouse.db import open_warehouse, view_sql
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

TABLES = ("runs", "steps", "epochs", "layers", "monitor_samples", "gpu_samples", "step_phases", "exchange_calibration", "images", "studies",
          "study_findings", "study_cells", "schema_migrations")


@pytest.fixture()
def filled(tmp_path: Path) -> Path:
    path = tmp_path / "w.duckdb"
    for repeat in range(2):
        make_bundle(tmp_path / "results", cell_id="a" * 16, repeat=repeat)
    make_bundle(tmp_path / "results", cell_id="b" * 16, status="failed", exit_code=1)
    assert len(ingest([tmp_path / "results"], warehouse=path).ingested) == 3
    return path


_PLAIN = """
import sys
sys.modules["pytz"] = None  # any import of it fails
import duckdb
con = duckdb.connect()
con.execute(open(sys.argv[1]).read())
for name in sys.argv[2:]:
    rows = con.execute(f'SELECT * FROM "{name}"').fetchall()
    print(name, len(rows))
"""


def test_a_plain_client_without_pytz_fetches_every_table_and_view(filled: Path) -> None:
    names = [*TABLES, *view_sql()]
    res = subprocess.run([sys.executable, "-c", _PLAIN, "attach.sql", *names], cwd=filled, env=client_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    counts = dict(line.split() for line in res.stdout.splitlines())
    assert list(counts) == names
    assert (counts["runs"], counts["run_overview"], counts["steps"]) == ("3", "3", "18")


def test_the_duckdb_cli_reads_while_a_matrun_writer_holds_the_warehouse(filled: Path) -> None:
    cli = shutil.which("duckdb", path=str(Path(sys.executable).parent))
    assert cli, "the DuckDB CLI (duckdb-cli) is a test dependency"
    with open_warehouse(filled) as wh:  # the writer lock is held meanwhile
        wh.con.execute("SELECT count(*) FROM runs").fetchone()
        res = subprocess.run([cli, "-init", "attach.sql", "-csv", "-c",
                              "SELECT status, count(*) AS n FROM run_overview GROUP BY status "
                              "ORDER BY status"], capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL, cwd=filled, env=client_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-3:] == ["status,n", "failed,1", "ok,2"]


_POLLER = """
import sys, time
from pathlib import Path
import duckdb
attach, steps, stop = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
text = open(attach).read()
opens = refused = inconsistent = 0
while not stop.exists():
    opens += 1
    try:
        # no progress bar: on a loaded machine a query past 2 s printed one to stdout
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        con.execute(text)
        runs, rows = con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps)").fetchone()
        inconsistent += rows != runs * steps
        con.close()
    except duckdb.Error as exc:
        refused += 1
        print(exc, file=sys.stderr)
    time.sleep(0.05)
print(opens, refused, inconsistent)
"""


def test_readers_polling_every_50_ms_are_never_refused_nor_see_half_an_ingest(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    steps = 200
    seconds = [0.02] * 10 + [0.01] * (steps - 10)
    make_bundle(tmp_path / "first", cell_id="f" * 16, step_seconds=seconds, warmup_steps=10)
    ingest([tmp_path / "first"], warehouse=path)
    bundles = [make_bundle(tmp_path / "results", cell_id=f"{i:016x}", step_seconds=seconds,
                           warmup_steps=10) for i in range(9)]
    stop = tmp_path / "stop"
    poller = subprocess.Popen([sys.executable, "-c", _POLLER, "attach.sql", str(steps), str(stop)], cwd=path,
                              env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        for bundle in bundles[:4]:  # as a sweep ingests: one bundle per call
            assert len(ingest([bundle], warehouse=path).ingested) == 1
        assert len(ingest([tmp_path / "results"], warehouse=path).ingested) == 5  # one batch
    finally:
        stop.write_text("")
        out, err = poller.communicate(timeout=120)
    opens, refused, inconsistent = map(int, out.splitlines()[-1].split())
    assert (refused, inconsistent) == (0, 0), err
    assert opens >= 10  # it really polled during the ingests


def test_many_small_ingests_are_compacted_and_lose_nothing(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maintenance, "MAX_FILES", 8)
    path = tmp_path / "w.duckdb"
    seconds = [0.02] * 10 + [0.01] * 90
    for i in range(20):  # as a sweep ingests: one bundle per call, a steps file each
        bundle = make_bundle(tmp_path / "results", cell_id=f"{i:016x}", step_seconds=seconds,
                             warmup_steps=10)
        report = ingest([bundle], warehouse=path)
        assert len(report.ingested) == 1 and not report.warnings
    with open_warehouse(path) as wh:
        files = maintenance.data_files(wh.con)
        assert 1 <= files["steps"] <= 8  # merged whenever it passed 8
        assert wh.con.execute("SELECT count(*), count(DISTINCT run_id) FROM steps").fetchone() == (2000, 20)
        done = maintenance.maintain(wh.con, force=True)
        assert done is not None and done.files_after <= done.files_before
        assert maintenance.data_files(wh.con)["steps"] == 1
    assert run_query("SELECT count(*) FROM run_overview", warehouse=path)[1] == [(20,)]
