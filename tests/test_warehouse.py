"""Opening the warehouse: migrations, views, locking, bad files and read-only queries.

Every test uses a real DuckDB file in tmp_path; the lock test holds the file from a real
second process, because DuckDB's lock is per process.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from bundle_factory import make_bundle
from lake_client import client_env
from matrun.errors import QueryError, WarehouseError, WarehouseLocked
from matrun.warehouse import db, materialise
from matrun.warehouse.db import VIEW_COMMENT_PREFIX, open_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

TABLES = {"runs", "steps", "epochs", "monitor_samples", "gpu_samples", "step_phases", "exchange_calibration", "layers", "images", "studies", "study_findings",
          "study_cells", "tunings", "tuning_trials", "schema_migrations", "cell_cache", "cache_state",
          *(cache.table for cache in materialise.CACHED)}
VIEWS = {"run_overview", "cell_status", "cell_durations", "baseline", "epoch_curve",
         "provenance"}


def _names(con: duckdb.DuckDBPyConnection, catalog: str) -> set[str]:
    return {row[0] for row in con.execute(
        f"SELECT {catalog[:-1]}_name FROM duckdb_{catalog}() "
        "WHERE schema_name = 'main' AND NOT internal").fetchall()}


def _migration_rows(path: Path) -> list[tuple]:
    with open_warehouse(path) as wh:
        return wh.con.execute("SELECT version, name, CAST(applied_at AS VARCHAR) "
                              "FROM schema_migrations ORDER BY version").fetchall()


# -- migrations and views ----------------------------------------------------------------


def test_new_warehouse_has_tables_views_and_every_migration_row(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "matrun.duckdb"
    with open_warehouse(path) as wh:
        assert wh.path == path and not wh.read_only
        assert _names(wh.con, "tables") == TABLES
        assert VIEWS <= _names(wh.con, "views")
    rows = _migration_rows(path)
    assert [(v, n) for v, n, _ in rows] == [(1, "initial"), (2, "layers"), (3, "images"), (4, "studies"),
                                       (5, "bundle_stat"), (6, "view_caches"), (7, "gpu_energy_state"), (8, "phases"),
                                       (9, "busy_set_aside"), (10, "design_level"), (11, "language_models"), (12, "tunings")]
    assert rows[0][2]  # applied_at recorded


def test_reopening_does_not_reapply_migrations(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    first = _migration_rows(path)
    with open_warehouse(path) as wh:  # data survives a re-open: nothing was re-created
        wh.con.execute("INSERT INTO steps VALUES ('r/0-1', 0, 0, 'timed', 0.5, 64)")
    second = _migration_rows(path)
    assert second == first
    with open_warehouse(path, read_only=True) as wh:
        assert wh.con.execute("SELECT count(*) FROM steps").fetchone() == (1,)


def test_views_are_recreated_on_every_writer_connect(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:
        wh.con.execute("DROP VIEW cell_status")
        wh.con.execute("CREATE OR REPLACE VIEW baseline AS SELECT 1 AS stale")
        wh.con.execute("CREATE VIEW my_own AS SELECT 42 AS answer")
        wh.con.execute("CREATE VIEW retired AS SELECT 1 AS x")
        wh.con.execute(f"COMMENT ON VIEW retired IS '{VIEW_COMMENT_PREFIX}views/retired.sql'")
    with open_warehouse(path) as wh:
        views = _names(wh.con, "views")
        assert VIEWS <= views
        assert "my_own" in views          # a user's own view is left alone
        assert "retired" not in views     # a view matrun made whose file is gone is dropped
        columns = [d[0] for d in wh.con.execute("SELECT * FROM baseline LIMIT 0").description]
        assert columns[:3] == ["sweep", "cell_id", "framework"]
        assert wh.con.execute("SELECT count(*) FROM cell_status").fetchone() == (0,)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:
        wh.con.execute("INSERT INTO schema_migrations (version, name) VALUES (999, 'future')")
    newest = max(m.version for m in db.migrations())
    message = f"warehouse {path} has schema version 999; this matrun knows up to {newest}: upgrade matrun"
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(path):
            pass
    assert str(err.value) == message
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(path, read_only=True):
            pass
    assert str(err.value) == message


def test_a_reader_checks_again_once_a_writer_changed_the_warehouse(tmp_path: Path) -> None:
    """The schema and view checks run once per reader instance (db._CHECKED); an instance is
    pinned to one snapshot, so a writer's change makes a new instance, checked again."""
    path = tmp_path / "w.duckdb"
    with open_warehouse(path):
        pass
    for _ in range(2):  # the second open reuses the checked instance
        with open_warehouse(path, read_only=True) as wh:
            assert wh.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    assert len([key for key in db._CHECKED if key[1] == str(path)]) == 1
    with open_warehouse(path) as wh:
        wh.con.execute("INSERT INTO schema_migrations (version, name) VALUES (999, 'future')")
    with pytest.raises(WarehouseError, match="has schema version 999"):
        with open_warehouse(path, read_only=True):
            pass
    with pytest.raises(WarehouseError, match="has schema version 999"):  # refused every time
        with open_warehouse(path, read_only=True):
            pass


def test_read_only_refuses_a_warehouse_with_pending_migrations(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:
        wh.con.execute("DELETE FROM schema_migrations")
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(path, read_only=True):
            pass
    newest = max(m.version for m in db.migrations())
    assert str(err.value) == (f"warehouse {path} was written by an older matrun (schema version "
                              f"0, this matrun has {newest}); run `matrun ingest` on it once to upgrade it")


# -- files that are not warehouses -------------------------------------------------------


def test_read_only_on_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.duckdb"
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(path, read_only=True):
            pass
    assert str(err.value) == (f"warehouse {path} does not exist; run `matrun sweep` or "
                              "`matrun ingest` first to create it")
    assert not path.exists()
    with pytest.raises(WarehouseError):
        run_query("SELECT 1", warehouse=path)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_file_that_is_not_duckdb(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_text("these are my notes, not a database\n" * 200)
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(path, read_only=read_only):
            pass
    assert str(err.value) == (f"{path} is not a DuckDB database file; point --warehouse at a "
                              "matrun warehouse or at a new name")
    assert path.read_text() == "these are my notes, not a database\n" * 200


def test_read_only_on_a_duckdb_file_that_is_not_a_warehouse(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(WarehouseError) as err:
        run_query("SELECT * FROM t", warehouse=path)
    assert str(err.value) == (f"{path} is a DuckDB file but not a matrun warehouse "
                              "(it has no schema_migrations table)")


# -- a second process ----------------------------------------------------------------------

_WRITER = """
import sys, time
from matrun.warehouse.db import open_warehouse
with open_warehouse(sys.argv[1]) as wh:
    print("holding", flush=True)
    hold_s = float(sys.argv[2])
    if hold_s > 0:
        time.sleep(hold_s)
    else:
        sys.stdin.readline()
"""

_READER = """
import sys
import duckdb
con = duckdb.connect()
con.execute(open("attach.sql").read())  # the warehouse's, in its directory, as a plain client would
con.execute("BEGIN TRANSACTION")
print(con.execute("SELECT count(*) FROM runs").fetchone()[0], flush=True)
sys.stdin.readline()
print(con.execute("SELECT count(*) FROM runs").fetchone()[0], flush=True)  # its snapshot
con.execute("COMMIT")
print(con.execute("SELECT count(*) FROM runs").fetchone()[0], flush=True)  # the newest
"""


def _hold(path: Path, hold_s: float = 0.0) -> subprocess.Popen[str]:
    """A real second process holding the warehouse open for writing."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(hold_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(timeout=30)


def test_second_writer_waits_then_gets_warehouse_locked_and_readers_never_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path):
        pass
    make_bundle(tmp_path / "results")
    monkeypatch.setattr(db, "WRITER_WAIT_S", 0.5)
    proc = _hold(path)
    try:
        expected = (f"warehouse {path} is being written by another matrun process (pid "
                    f"{proc.pid} on {socket.gethostname()}); wait for it to finish or use a "
                    "different --warehouse")
        start = time.monotonic()
        with pytest.raises(WarehouseLocked) as err:
            ingest([tmp_path / "results"], warehouse=path)
        assert str(err.value) == expected
        assert time.monotonic() - start >= 0.5  # it waited for the other writer first
        assert run_query("SELECT count(*) FROM runs", warehouse=path)[1] == [(0,)]
    finally:
        _release(proc)
    report = ingest([tmp_path / "results"], warehouse=path)
    assert len(report.ingested) == 1


def test_wait_s_waits_until_the_other_writer_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    proc = _hold(path, hold_s=1.0)
    try:
        with open_warehouse(path, wait_s=60) as wh:
            assert wh.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    finally:
        proc.wait(timeout=30)


def test_a_plain_client_holding_a_snapshot_never_stops_an_ingest(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path):
        pass
    reader = subprocess.Popen([sys.executable, "-c", _READER], cwd=path, env=client_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "0"
        make_bundle(tmp_path / "results")
        assert len(ingest([tmp_path / "results"], warehouse=path).ingested) == 1
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "0"  # the reader's snapshot is unchanged
        assert reader.stdout.readline().strip() == "1"  # and its next one has the new run
    finally:
        reader.stdin.close()
        reader.wait(timeout=30)
    assert reader.returncode == 0


# -- read-only queries -------------------------------------------------------------------


@pytest.fixture()
def filled(tmp_path: Path) -> Path:
    path = tmp_path / "w.duckdb"
    make_bundle(tmp_path / "results")
    ingest([tmp_path / "results"], warehouse=path)
    return path


def test_run_query_returns_columns_and_rows(filled: Path) -> None:
    columns, rows = run_query(
        "SELECT run_id, status, started_at FROM run_overview", warehouse=filled)
    assert columns == ["run_id", "status", "started_at"]
    assert len(rows) == 1
    run_id, status, started_at = rows[0]
    assert (run_id, status) == ("c0ffee0000000001/0-1", "ok")
    assert started_at.isoformat() == "2026-11-22T01:50:00"  # TIMESTAMP, in UTC


def test_run_query_empty_sql(filled: Path) -> None:
    for sql in ("", "   \n  "):
        with pytest.raises(QueryError) as err:
            run_query(sql, warehouse=filled)
        assert str(err.value) == ('query is empty: give a SQL statement, such as '
                                  '"SELECT * FROM run_overview"')


def test_run_query_reports_duckdb_errors_on_one_line(filled: Path) -> None:
    with pytest.raises(QueryError) as err:
        run_query("SELECT nope FROM runs", warehouse=filled)
    assert str(err.value).startswith('query failed: Binder Error: Referenced column "nope" not found')
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("sql", [
    "DROP TABLE runs",
    "DELETE FROM runs",
    "INSERT INTO steps VALUES ('x', 0, 0, 'timed', 1.0, 1)",
    "CREATE TABLE evil AS SELECT 1",
    "SELECT 1; DROP TABLE runs",
    "COPY runs TO '{tmp}/stolen.csv'",
    "EXPORT DATABASE '{tmp}/export'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
    "ATTACH '{tmp}/other.duckdb' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "DETACH lake",
    "CALL ducklake_expire_snapshots('lake', older_than => now())",
    "SELECT * FROM read_parquet('{tmp}/w.duckdb/data/**/*.parquet') UNION ALL SELECT 1; DROP TABLE runs",
])
def test_hostile_sql_fails_and_changes_nothing(filled: Path, sql: str) -> None:
    tmp = filled.parent
    before = run_query("SELECT count(*) FROM runs", warehouse=filled)
    files_before = sorted(p.name for p in tmp.iterdir())
    with pytest.raises(QueryError) as err:
        run_query(sql.format(tmp=tmp), warehouse=filled)
    assert str(err.value).startswith(("query failed: ", "query refused: "))  # DuckDB's error, or matrun's check
    assert run_query("SELECT count(*) FROM runs", warehouse=filled) == before == (
        ["count_star()"], [(1,)])
    assert sorted(p.name for p in tmp.iterdir()) == files_before


def test_a_reader_brings_views_of_another_matrun_version_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:  # as another matrun version left it: a view missing, one changed
        wh.con.execute("DROP VIEW baseline")
        wh.con.execute("CREATE OR REPLACE VIEW cell_durations AS SELECT 1 AS old")
        wh.con.execute("COMMENT ON VIEW cell_durations IS 'matrun view: views/cell_durations.sql'")
        wh.con.execute("INSERT INTO steps VALUES ('r/0-1', 0, 0, 'timed', 0.5, 64)")
    with open_warehouse(path, read_only=True) as wh:
        assert "baseline" in _names(wh.con, "views")
        assert [d[0] for d in wh.con.execute("SELECT * FROM cell_durations").description] == [
            "cell_id", "runs", "wall_seconds_median"]
        assert wh.con.execute("SELECT count(*) FROM steps").fetchone() == (1,)  # data untouched

