"""A warehouse of the single-file format (matrun before the DuckLake warehouse) is upgraded by
the first command that writes to it: every row copied into a new lake, the old file kept inside
it, nothing lost.  A command that only reads leaves it as it is and says which command
upgrades it.

The fixture ``golden/legacy/matrun-c04bc4d.duckdb.gz`` was written by matrun c04bc4d with
the DuckDB it installed (2.0.0), whose storage this matrun's DuckDB cannot read: it is read by
the DuckDB ``make`` installs beside matrun (``<venv>/legacy-duckdb``).  Its maker is
``golden/legacy/make_legacy.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bundle_factory import make_bundle
from lake_client import plain_connect
from matrun.errors import WarehouseError
from matrun.warehouse import db
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

FIXTURE = Path(__file__).parent / "golden" / "legacy" / "matrun-c04bc4d.duckdb.gz"
MATRUN = [sys.executable, "-m", "matrun.runner.cli.main"]
COUNTS = {"runs": 6, "steps": 36, "epochs": 12, "layers": 1, "monitor_samples": 12, "images": 1,
          "studies": 1, "study_findings": 2, "study_cells": 8}


def legacy(tmp_path: Path, name: str = "matrun.duckdb") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def counts(path: Path) -> dict[str, int]:
    with open_warehouse(path, read_only=True) as wh:
        return {t: wh.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COUNTS}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_reader_leaves_it_as_it_is_and_matrun_warehouse_upgrade_upgrades_it(tmp_path: Path) -> None:
    path = legacy(tmp_path)
    before = digest(path)
    res = subprocess.run([*MATRUN, "query", "SELECT count(*) AS n FROM runs", "--format", "csv",
                          "--warehouse", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"Error: warehouse {path} is in the single-file format of an older matrun; a "
                          "read-only command leaves it as it is, a command that writes upgrades it (its "
                          "runs kept, the old file inside as legacy.duckdb): matrun warehouse upgrade "
                          f"--warehouse {path}\n")
    assert digest(path) == before and sorted(os.listdir(tmp_path)) == ["matrun.duckdb"]

    res = subprocess.run([*MATRUN, "warehouse", "upgrade", "--warehouse", str(path)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (f"warehouse {path}: upgraded it from the single-file format; the old file is "
                          f"{path / 'legacy.duckdb'}\n"
                          f"warehouse {path}: schema version {len(db.migrations())}, with this matrun's views\n")
    assert path.is_dir() and digest(path / "legacy.duckdb") == before  # the old file, kept as it was
    assert sorted(os.listdir(tmp_path)) == ["matrun.duckdb"]  # no scratch left beside it
    assert counts(path) == COUNTS
    # values came across: times in UTC, JSON, lists, the image and the study
    con = plain_connect(path)
    try:
        assert con.execute("SELECT min(started_at)::VARCHAR, count(DISTINCT sweep), "
                           "count(*) FILTER (WHERE status = 'failed') FROM runs").fetchone() == (
            "2026-11-22 01:50:00", 2, 1)
        assert con.execute("SELECT params->>'threads' FROM runs WHERE cell_id = repeat('a', 16) "
                           "AND \"repeat\" = 0").fetchone() == ("2",)
        assert con.execute("SELECT tag, build_seconds FROM images").fetchone() == (
            "matrun/torch:cpu-0123456789ab", 321.5)
        assert con.execute("SELECT study FROM studies").fetchone() == ("A6",)
        assert con.execute("SELECT count(*) FROM findings").fetchone()[0] == 2
        assert con.execute("SELECT max(version) FROM schema_migrations").fetchone() == (
            len(db.migrations()),)
    finally:
        con.close()


def test_after_the_upgrade_history_holds_and_new_runs_go_in(tmp_path: Path) -> None:
    path = legacy(tmp_path)
    make_bundle(tmp_path / "results", sweep="new", cell_id="e" * 16)
    report = ingest([tmp_path / "results"], warehouse=path)  # a writer upgrades it too
    assert report.counts == {"ingested": 1, "unchanged": 0, "skipped": 0, "incomplete": 0}
    assert run_query("SELECT cell_id, ok FROM cell_status WHERE \"repeat\" = 0 ORDER BY cell_id",
                     warehouse=path)[1] == [("a" * 16, True), ("b" * 16, True), ("c" * 16, False),
                                            ("d" * 16, True), ("e" * 16, True)]


def test_a_single_file_warehouse_this_duckdb_reads_is_upgraded_directly(tmp_path: Path) -> None:
    old = legacy(tmp_path, "old.duckdb")
    exported = tmp_path / "exported"
    subprocess.run([sys.executable, "-c", (
        "import sys, duckdb\n"
        "duckdb.connect(sys.argv[1], read_only=True).execute(\n"
        "    f\"EXPORT DATABASE '{sys.argv[2]}' (FORMAT parquet)\")\n"), str(old), str(exported)],
        env={**os.environ, "PYTHONPATH": str(db.legacy_duckdb())}, check=True)
    path = tmp_path / "matrun.duckdb"
    con = duckdb.connect(str(path))  # the same tables in this DuckDB's own format
    for table in sorted(exported.glob("*.parquet")):
        con.execute(f'CREATE TABLE "{table.stem}" AS SELECT * FROM read_parquet(\'{table}\')')
    con.close()
    before = digest(path)
    assert db.upgrade_warehouse(path)[0] == [f"upgraded it from the single-file format; the old file is "
                                             f"{path / 'legacy.duckdb'}"]
    assert counts(path) == COUNTS
    assert digest(path / "legacy.duckdb") == before


def test_without_a_duckdb_that_reads_it_the_file_is_left_alone_and_the_way_out_said(
        tmp_path: Path) -> None:
    path = legacy(tmp_path)
    before = digest(path)
    env = {**os.environ, db.LEGACY_DUCKDB_ENV: str(tmp_path / "none")}
    res = subprocess.run([*MATRUN, "warehouse", "upgrade", "--warehouse", str(path)],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr.startswith(f"Error: warehouse {path} is a single-file warehouse written by a "
                                 "newer DuckDB than this matrun's")
    assert "matrun ingest RESULTS --warehouse NEW" in res.stderr and "Traceback" not in res.stderr
    assert digest(path) == before and sorted(os.listdir(tmp_path)) == ["matrun.duckdb"]


def test_an_upgrade_cut_short_between_its_renames_is_finished_by_the_next_writer(tmp_path: Path) -> None:
    path = legacy(tmp_path)
    db.upgrade_warehouse(path)
    assert counts(path) == COUNTS
    # As a kill between the two renames leaves it: the old file inside the new lake, which
    # has not taken the path yet.
    cut = tmp_path / f".matrun.duckdb.upgrading-{socket.gethostname()}-999999999-0a0a0a0a"
    db.forget_instances()
    os.rename(path, cut)
    with pytest.raises(WarehouseError) as err:  # a reader leaves it
        counts(path)
    assert str(err.value) == (f"warehouse {path} does not exist; its upgrade was cut short: a command that "
                              f"writes to it finishes it (matrun warehouse upgrade --warehouse {path})")
    assert sorted(os.listdir(tmp_path)) == [cut.name]
    assert db.upgrade_warehouse(path) == (["finished an upgrade from the single-file format that was cut "
                                           "short"], len(db.migrations()))
    assert counts(path) == COUNTS
    assert sorted(os.listdir(tmp_path)) == ["matrun.duckdb"]


def test_a_duckdb_file_that_is_not_a_warehouse_is_not_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    before = digest(path)
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(path):
            pass
    assert str(err.value) == (f"{path} is a DuckDB file but not a matrun warehouse (it has no "
                              "schema_migrations table)")
    assert digest(path) == before and sorted(os.listdir(tmp_path)) == ["other.duckdb"]
