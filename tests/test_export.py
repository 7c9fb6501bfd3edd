"""``matrun export``: the warehouse's tables and views as Parquet and CSV files with a manifest
(docs/WAREHOUSE.md "Export"), read back with Polars and pyarrow and compared with what SQL on
the warehouse returns; the refusals (bad names, a directory in the way) and the failures (a
view that fails, a full disk) leave nothing behind.

Warehouses are real DuckDB files built from real bundles (``bundle_factory``) with ``ingest``;
the CLI runs as the real ``matrun`` script.  A full disk and a read-only disk are real tmpfs
mounts (root only: those tests skip without it).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import os
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pyarrow.parquet as pq
import pytest

from bundle_factory import make_bundle
from matrun.errors import InputError, MatrunError, WarehouseError
from matrun.warehouse.db import migrations, open_warehouse, view_sql
from matrun.warehouse.export import MANIFEST, export_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import csv_value, run_query

MATRUN = str(Path(sys.executable).with_name("matrun"))
TABLES = {"runs", "steps", "epochs", "layers", "monitor_samples", "gpu_samples", "step_phases", "exchange_calibration", "images", "studies", "study_findings",
          "study_cells", "tunings", "tuning_trials", "schema_migrations"}
VIEWS = set(view_sql())
#: Text a spreadsheet would run as a formula, in a text column (runs.error_tail).
FORMULAS = ("=SUM(A1:A9)", "+1+1", "-2 or so", "@cmd")
UTC = timezone.utc


def matrun(*args: object, cwd: Path, tz: str = "UTC") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TZ": tz, "COLUMNS": "200"}
    proc = subprocess.run([MATRUN, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ok runs (one with probe mismatches), four failed runs whose error tails look like
    formulas, and a study row (a naive TIMESTAMP, text starting with '=')."""
    root = tmp_path_factory.mktemp("export")
    results = root / "results"
    make_bundle(results, cell_id="c0ffee0000000001", mismatches=["threads: asked 2, in force 1", "=x"])
    make_bundle(results, cell_id="c0ffee0000000002", params={"threads": 2}, layers=(
        {"name": "conv1", "kind": "Conv2d", "forward_seconds": 0.001, "backward_seconds": 0.002},))
    for n, tail in enumerate(FORMULAS):
        make_bundle(results, cell_id=f"badc0ffee000000{n}", status="failed", exit_code=1, error_tail=tail)
    path = root / "w.duckdb"
    report = ingest([results], warehouse=path)
    assert len(report.ingested) == 6 and not report.skipped
    with open_warehouse(path) as wh:
        wh.con.execute("INSERT INTO studies VALUES ('demo', '=HYPERLINK(\"x\")', '', 'Table 1', 'cpu', 0, "
                       "NULL, 'studies/demo.toml', '{\"rows\": [[1, 2.5]]}', "
                       "TIMESTAMP '2026-11-22 01:02:03.456789')")
    return path


@pytest.fixture(scope="module")
def parquet_export(warehouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pq") / "out"
    export_warehouse(out, warehouse=warehouse)
    return out


def sql_rows(warehouse: Path, sql: str) -> list[dict[str, Any]]:
    columns, rows = run_query(sql, warehouse=warehouse)
    return [dict(zip(columns, row)) for row in rows]


def canonical(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as sorted JSON texts: instants in UTC (the session's time zone aside), so two
    reads of the same rows compare equal in any order."""
    def value(v: Any) -> Any:
        if isinstance(v, datetime):
            return (v.astimezone(UTC) if v.tzinfo else v).isoformat()
        if isinstance(v, Decimal):
            return str(v)
        return v
    return sorted(json.dumps({k: value(v) for k, v in row.items()}, default=str) for row in rows)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(directory: Path) -> list[str]:
    """Hidden entries an export may make beside its directory (none must stay)."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@contextmanager
def tmpfs(where: Path, size: str, *options: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


# -- Parquet ----------------------------------------------------------------------------------


def test_every_table_and_matrun_view_is_exported_with_the_rows_sql_returns(
        warehouse: Path, parquet_export: Path) -> None:
    assert VIEWS and {"baseline", "run_overview"} <= VIEWS
    assert sorted(os.listdir(parquet_export)) == sorted([MANIFEST, *(f"{n}.parquet" for n in TABLES | VIEWS)])
    for name in sorted(TABLES | VIEWS):
        columns, rows = run_query(f"SELECT * FROM {name}", warehouse=warehouse)
        table = pq.read_table(parquet_export / f"{name}.parquet")
        assert table.num_rows == len(rows) == pl.read_parquet(parquet_export / f"{name}.parquet").height, name
        assert table.column_names == columns, name
        assert canonical(table.to_pylist()) == canonical([dict(zip(columns, row)) for row in rows]), name
    assert pq.read_metadata(parquet_export / "runs.parquet").num_rows == 6


def test_timestamps_lists_and_json_keep_their_types(warehouse: Path, parquet_export: Path) -> None:
    schema = pq.read_schema(parquet_export / "runs.parquet")
    assert str(schema.field("started_at").type) == "timestamp[us]"  # TIMESTAMP, in UTC
    assert str(schema.field("mismatches").type) == "list<element: string>"
    assert str(schema.field("params").type) == "string"  # JSON as its text
    runs = pl.read_parquet(parquet_export / "runs.parquet").filter(pl.col("status") == "ok").sort("cell_id")
    assert runs.schema["started_at"] == pl.Datetime("us")
    assert runs["started_at"].to_list() == [datetime(2026, 11, 22, 1, 50)] * 2
    assert runs["mismatches"].to_list() == [["threads: asked 2, in force 1", "=x"], []]
    assert [json.loads(params)["threads"] for params in runs["params"]] == [1, 2]
    studies = pl.read_parquet(parquet_export / "studies.parquet")
    assert studies.schema["declared_at"] == pl.Datetime("us")  # naive, as stored (UTC by convention)
    assert studies["declared_at"].to_list() == [datetime(2026, 11, 22, 1, 2, 3, 456789)]
    migrations = pq.read_table(parquet_export / "schema_migrations.parquet")
    assert str(migrations.schema.field("applied_at").type) == "timestamp[us]"


def test_the_manifest_describes_every_file(warehouse: Path, parquet_export: Path) -> None:
    manifest = json.loads((parquet_export / MANIFEST).read_text(encoding="utf-8"))
    (version,) = run_query("SELECT max(version) FROM schema_migrations", warehouse=warehouse)[1][0]
    assert manifest["schema_version"] == version == len(migrations())
    assert manifest["format"] == "parquet" and manifest["manifest_version"] == 1
    assert manifest["warehouse"] == str(warehouse) and manifest["matrun_version"]
    created = datetime.fromisoformat(manifest["created_at"])
    assert created.utcoffset().total_seconds() == 0 and abs((datetime.now(UTC) - created).total_seconds()) < 3600
    assert set(manifest["tables"]) == TABLES | VIEWS
    for name, entry in manifest["tables"].items():
        path = parquet_export / entry["file"]
        assert entry["file"] == f"{name}.parquet"
        assert entry["kind"] == ("table" if name in TABLES else "view")
        assert entry["sha256"] == sha256(path) and entry["bytes"] == path.stat().st_size
        assert entry["rows"] == pq.read_metadata(path).num_rows
        described = run_query(f"DESCRIBE {name}", warehouse=warehouse)[1]
        assert [(c["name"], c["duckdb_type"]) for c in entry["columns"]] == [(r[0], r[1]) for r in described]
        assert [c["arrow_type"] for c in entry["columns"]] == [str(f.type) for f in pq.read_schema(path)]
    runs = {c["name"]: c for c in manifest["tables"]["runs"]["columns"]}
    assert runs["params"]["duckdb_type"] == "JSON" and runs["mismatches"]["duckdb_type"] == "VARCHAR[]"


def test_rows_stream_in_batches_one_row_group_each(warehouse: Path, tmp_path: Path) -> None:
    done = export_warehouse(tmp_path / "out", warehouse=warehouse, tables=["steps"], batch_rows=5)
    steps = pq.ParquetFile(tmp_path / "out" / "steps.parquet")
    assert done.tables[0].rows == steps.metadata.num_rows == 36
    assert [steps.metadata.row_group(i).num_rows for i in range(steps.num_row_groups)] == [5] * 7 + [1]
    assert canonical(steps.read().to_pylist()) == canonical(sql_rows(warehouse, "SELECT * FROM steps"))


def test_chosen_tables_and_views_in_the_order_given(warehouse: Path, tmp_path: Path) -> None:
    done = export_warehouse(tmp_path / "out", warehouse=warehouse, tables=["baseline", "RUNS", "baseline"])
    assert [(t.name, t.kind) for t in done.tables] == [("baseline", "view"), ("runs", "table")]
    assert sorted(os.listdir(tmp_path / "out")) == ["baseline.parquet", MANIFEST, "runs.parquet"]
    assert list(json.loads((tmp_path / "out" / MANIFEST).read_text())["tables"]) == ["baseline", "runs"]


def test_an_empty_warehouse_gives_every_file_with_its_schema(
        warehouse: Path, parquet_export: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.duckdb"
    ingest([], warehouse=empty)
    export_warehouse(tmp_path / "pq", warehouse=empty)
    export_warehouse(tmp_path / "csv", warehouse=empty, fmt="csv")
    for name in TABLES | VIEWS:
        got = pq.read_table(tmp_path / "pq" / f"{name}.parquet")
        full = pq.read_schema(parquet_export / f"{name}.parquet")
        expected_rows = len(migrations()) if name == "schema_migrations" else 0  # one row per migration
        assert (got.num_rows, got.schema.names, got.schema.types) == (expected_rows, full.names, full.types), name
        header = (tmp_path / "csv" / f"{name}.csv").read_text(encoding="utf-8").splitlines()
        assert header[0].split(",") == full.names and len(header) == 1 + expected_rows, name
    assert pl.read_parquet(tmp_path / "pq" / "runs.parquet").columns == pq.read_schema(
        parquet_export / "runs.parquet").names


# -- CSV --------------------------------------------------------------------------------------


def test_csv_is_what_matrun_query_writes_in_any_time_zone(warehouse: Path, tmp_path: Path) -> None:
    # The export runs in India's time zone; its timestamps are still written in UTC, so each
    # table reads exactly as `matrun query --format csv` run in UTC writes it.
    proc = matrun("export", tmp_path / "csv", "--format", "csv", "--warehouse", warehouse, cwd=tmp_path,
                  tz="Asia/Kolkata")
    assert proc.returncode == 0, proc.stderr
    for name in sorted(TABLES):
        query = matrun("query", f"SELECT * FROM {name}", "--format", "csv", "--warehouse", warehouse, cwd=tmp_path)
        assert query.returncode == 0, query.stderr
        assert (tmp_path / "csv" / f"{name}.csv").read_text(encoding="utf-8") == query.stdout, name
    for name in sorted(VIEWS):  # a view's rows may come in another order
        text = (tmp_path / "csv" / f"{name}.csv").read_text(encoding="utf-8")
        columns, rows = run_query(f"SELECT * FROM {name}", warehouse=warehouse)
        header, *lines = list(csv.reader(io.StringIO(text)))
        assert header == columns and len(lines) == len(rows) == pl.read_csv(io.StringIO(text)).height, name


def test_csv_neutralises_formulas_as_matrun_query_does(warehouse: Path, tmp_path: Path) -> None:
    export_warehouse(tmp_path / "csv", warehouse=warehouse, fmt="csv", tables=["runs", "studies"])
    runs = list(csv.DictReader((tmp_path / "csv" / "runs.csv").open(encoding="utf-8", newline="")))
    tails = sorted(row["error_tail"] for row in runs if row["status"] == "failed")
    assert tails == sorted(csv_value(tail) for tail in FORMULAS) == ["'+1+1", "'-2 or so", "'=SUM(A1:A9)", "'@cmd"]
    ok = sorted((row for row in runs if row["status"] == "ok"), key=lambda row: row["cell_id"])
    assert json.loads(ok[0]["mismatches"]) == ["threads: asked 2, in force 1", "=x"]  # a list as JSON text
    assert ok[0]["started_at"] == "2026-11-22T01:50:00" and ok[0]["exit_code"] == "0"  # UTC
    assert ok[1]["mismatches"] == "[]" and json.loads(ok[0]["params"])["threads"] == 1
    (study,) = csv.DictReader((tmp_path / "csv" / "studies.csv").open(encoding="utf-8", newline=""))
    assert study["title"] == "'=HYPERLINK(\"x\")" and study["declared_at"] == "2026-11-22T01:02:03.456789"
    frame = pl.read_csv(tmp_path / "csv" / "runs.csv", try_parse_dates=True)
    assert frame.height == 6 and frame.schema["started_at"] == pl.Datetime("us")


# -- refusals: an Error line, exit 2, nothing written -------------------------------------------


def test_an_unknown_name_is_refused_naming_it_and_the_known_ones(warehouse: Path, tmp_path: Path) -> None:
    proc = matrun("export", tmp_path / "out", "--table", "runs", "-t", "nope", "-t", "bogus",
                  "--warehouse", warehouse, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    line = proc.stderr.strip()
    assert line.startswith("Error: --table nope, bogus: no such table or view in the warehouse (tables: epochs, "
                           "exchange_calibration, gpu_samples, images, layers, monitor_samples, runs, schema_migrations, "
                           "step_phases, steps, studies, study_cells, "
                           "study_findings, tuning_trials, tunings; views: baseline, "), line
    assert all(view in line for view in VIEWS) and "\n" not in line
    assert sorted(os.listdir(tmp_path)) == []


def test_a_directory_in_the_way_is_refused(warehouse: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, message in (
            (full, f"export directory {full} exists and is not empty; choose a new or empty directory, or add "
                   "--force to replace an earlier export"),
            (afile, f"export directory {afile} exists and is not a directory; choose a directory to export into"),
            (afile / "sub", f"export directory {afile}/sub: a part of the path is a file, not a directory"),
            (tmp_path / ("x" * 300), "export directory "),  # the path shown cut, with its length
    ):
        proc = matrun("export", out, "--warehouse", warehouse, cwd=tmp_path)
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr.startswith(f"Error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.endswith(" characters): file name too long\n"), proc.stderr
    # --force replaces only an earlier export: the notes stay.
    proc = matrun("export", full, "--force", "--warehouse", warehouse, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == (
        f"Error: export directory {full} holds files matrun export did not write (notes.txt); --force "
        "replaces only an earlier export: choose another directory\n")
    assert os.listdir(full) == ["notes.txt"] and afile.read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["afile", "full"]
    with pytest.raises(InputError, match="export format 'xlsx': expected parquet or csv"):
        export_warehouse(tmp_path / "out", warehouse=warehouse, fmt="xlsx")
    bad = matrun("export", tmp_path / "out", "--format", "xlsx", "--warehouse", warehouse, cwd=tmp_path)
    assert (bad.returncode, bad.stderr) == (2, "Error: --format 'xlsx': expected parquet or csv\n")


def test_an_empty_directory_is_used_and_force_replaces_an_earlier_export(warehouse: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = matrun("export", out, "--format", "csv", "--warehouse", warehouse, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = sum(entry["rows"] for entry in json.loads((out / MANIFEST).read_text())["tables"].values())
    assert proc.stdout == (f"exported {len(TABLES)} table(s) and {len(VIEWS)} view(s), {rows} rows, as csv to "
                           f"{out} (manifest: {out / MANIFEST})\n")
    assert len(os.listdir(out)) == len(TABLES | VIEWS) + 1

    again = matrun("export", out, "-t", "runs", "--warehouse", warehouse, cwd=tmp_path)
    assert again.returncode == 2 and "is not empty" in again.stderr
    forced = matrun("export", out, "-t", "runs", "--force", "--warehouse", warehouse, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith("exported 1 table(s) and 0 view(s), 6 rows, as parquet to ")
    assert sorted(os.listdir(out)) == [MANIFEST, "runs.parquet"]
    assert json.loads((out / MANIFEST).read_text())["format"] == "parquet"
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing beside it

    (out / "extra.txt").write_text("mine")
    refused = matrun("export", out, "--force", "--warehouse", warehouse, cwd=tmp_path)
    assert refused.returncode == 2 and "(extra.txt)" in refused.stderr
    assert sorted(os.listdir(out)) == ["extra.txt", MANIFEST, "runs.parquet"]


def test_a_user_view_is_exported_when_named_and_one_that_fails_leaves_nothing(
        warehouse: Path, tmp_path: Path) -> None:
    copy = tmp_path / "w.duckdb"
    shutil.copytree(warehouse, copy)  # the warehouse is a directory; its next writer fixes attach.sql
    with open_warehouse(copy) as wh:
        wh.con.execute("CREATE VIEW my_runs AS SELECT run_id, status FROM runs")
        # Fails at run time, after the first batches have been written.
        wh.con.execute("CREATE VIEW breaks AS SELECT CASE WHEN i < 50 THEN i ELSE CAST('x' || i AS INTEGER) END "
                       "AS v FROM range(100) t(i)")
    default = export_warehouse(tmp_path / "all", warehouse=copy)
    assert {t.name for t in default.tables} == TABLES | VIEWS  # a user's views only when named
    mine = export_warehouse(tmp_path / "mine", warehouse=copy, tables=["my_runs"])
    assert mine.tables[0].kind == "view" and pl.read_parquet(tmp_path / "mine" / "my_runs.parquet").height == 6

    earlier = sha256(tmp_path / "mine" / MANIFEST)
    for out, force in ((tmp_path / "new", False), (tmp_path / "mine", True)):
        with pytest.raises(WarehouseError, match=r"^reading view breaks failed: Conversion Error: .*; nothing was "
                                                 r"exported$"):
            export_warehouse(out, warehouse=copy, tables=["runs", "breaks"], force=force, batch_rows=10)
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []
    assert sha256(tmp_path / "mine" / MANIFEST) == earlier  # the earlier export is untouched


# -- the disk: read-only, full ----------------------------------------------------------------


def test_a_read_only_disk_is_an_error_naming_the_directory(warehouse: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "64k", "ro") as disk:
        proc = matrun("export", disk / "out", "--warehouse", warehouse, cwd=tmp_path)
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == f"Error: export directory {disk}/out: cannot write there: Read-only file system\n"


def test_a_full_disk_leaves_nothing_and_keeps_the_earlier_export(warehouse: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "2m") as disk:
        out = disk / "out"
        assert matrun("export", out, "-t", "runs", "--warehouse", warehouse, cwd=tmp_path).returncode == 0
        earlier = {name: sha256(out / name) for name in os.listdir(out)}
        filler = disk / "filler"
        with open(filler, "wb") as fh:  # leave about 40 KB: runs fits, every table does not
            st = os.statvfs(disk)
            fh.write(b"\0" * (st.f_bavail * st.f_frsize - 40_000))
        for target, force in ((disk / "new", []), (out, ["--force"])):
            proc = matrun("export", target, *force, "--warehouse", warehouse, cwd=tmp_path)
            assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
            assert proc.stderr == (f"Error: no space left on device: {target}; nothing was exported (an earlier "
                                   "export there is untouched): free some space and run the command again\n")
        assert sorted(os.listdir(disk)) == ["filler", "out"]
        assert {name: sha256(out / name) for name in os.listdir(out)} == earlier
        filler.unlink()
        assert matrun("export", out, "--force", "--warehouse", warehouse, cwd=tmp_path).returncode == 0
        assert len(os.listdir(out)) == len(TABLES | VIEWS) + 1


def test_errors_are_matrun_errors_in_the_library_too(warehouse: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such table or view"):
        export_warehouse(tmp_path / "out", warehouse=warehouse, tables=["nope"])
    with pytest.raises(MatrunError, match="does not exist"):
        export_warehouse(tmp_path / "out", warehouse=tmp_path / "missing.duckdb")
    assert os.listdir(tmp_path) == []
