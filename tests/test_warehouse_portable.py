"""A warehouse opens anywhere, and reading it changes nothing (issue 25, items 2 to 4).

- Portable: ``attach.sql`` names no absolute path, so a copied or moved warehouse opens with
  the one documented line (``cd W && duckdb -init attach.sql``) in the real DuckDB CLI and in
  a bare Python client, run from another directory, with the original out of the way; matrun
  reads and writes a copy without touching the original (compared byte for byte and by mtime,
  then deleted), and ``matrun shell`` opens it read-only from anywhere.
- Read-only means read-only: every statement kind DuckDB runs on a read-only attach, through
  ``run_query`` (``matrun query``'s library twin) and the CLI, leaves every file of the
  warehouse as it was, on a lake holding what DuckLake's ``CHECKPOINT`` and maintenance calls
  would write or delete (inlined rows, small files to merge, files scheduled for deletion, an
  orphan file), which a plain read-only client does write.
- A path that is not a warehouse (``/etc/passwd``, a directory with a ``catalog.sqlite`` that
  is text or another SQLite database, a dangling symbolic link, a FIFO, a missing path) gets an
  ``Error:`` line, exit 2, with nothing opened for writing or created beside it; a warehouse
  on a read-only file system (a read-only bind mount, root only) is read, and refused for
  writing with an ``Error:`` line; a symbolic link to a warehouse is one.

SQLite keeps two files beside a catalog in write-ahead-log mode: ``catalog.sqlite-shm``, where
every reader marks what it reads (its bytes change on any read), and ``catalog.sqlite-wal``,
the log, whose bytes are compared but not its time stamp; a writer's clean close removes both,
and the next reader makes them again (the log empty).  Every other file and directory keeps
its bytes and mtime.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
import pytest

from bundle_factory import make_bundle
from lake_client import client_env, plain_connect
from matrun.errors import NotAWarehouse, QueryError, WarehouseError
from matrun.warehouse import catalog, db
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MATRUN = [sys.executable, "-m", "matrun.runner.cli.main"]
STEPS = 30  # step records per run: more than DuckLake inlines, so each ingest writes a Parquet file
TOTALS = "SELECT (SELECT count(*) FROM runs) AS runs, (SELECT round(sum(seconds), 6) FROM steps) AS seconds"


def matrun(*args: object, cwd: Path, env: dict[str, str] | None = None,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MATRUN, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          input=stdin, timeout=600, stdin=None if stdin is not None else subprocess.DEVNULL)


def bundle(root: Path, n: int) -> Path:
    return make_bundle(root / "results", cell_id=f"{n:016x}", step_seconds=[0.01] * STEPS)


def state(root: Path) -> dict[str, object]:
    """Every directory and file under ``root`` with what must not change (module docstring)."""
    found: dict[str, object] = {}
    for where, dirs, files in os.walk(root):
        rel = os.path.relpath(where, root)
        found[rel + "/"] = os.lstat(where).st_mtime_ns
        for name in files:
            path = Path(where, name)
            key = os.path.join(rel, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):  # a link, a FIFO: never opened
                found[key] = (stat.S_IFMT(os.lstat(path).st_mode), os.lstat(path).st_mtime_ns)
            elif name == f"{catalog.CATALOG}-shm":
                found[key] = "present"
            elif name == f"{catalog.CATALOG}-wal":
                found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                st = os.lstat(path)
                found[key] = (st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


SHM, WAL = f"./{catalog.CATALOG}-shm", f"./{catalog.CATALOG}-wal"
EMPTY = hashlib.sha256(b"").hexdigest()


def assert_unchanged(before: dict[str, object], after: dict[str, object]) -> None:
    """Nothing changed but what SQLite's readers do (module docstring)."""
    made = set(after) - set(before)
    assert made <= {SHM, WAL}, made
    assert after.get(WAL) == EMPTY or WAL not in made
    if made:  # the directory's time stamp is the one of SQLite's files appearing
        before, after = {k: v for k, v in before.items() if k != "./"}, {k: v for k, v in after.items() if k != "./"}
    assert {k: v for k, v in after.items() if k not in made} == before


def copy_warehouse(source: Path, target: Path) -> Path:
    """``cp -a``: every file with its time stamps."""
    shutil.copytree(source, target, symlinks=True, copy_function=shutil.copy2)
    return target


def metadata(path: Path, sql: str) -> list[tuple]:
    """Rows of ``sql`` over the warehouse's SQLite catalog, read as an immutable file."""
    con = sqlite3.connect(f"file:{path / catalog.CATALOG}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def duckdb_cli() -> str:
    found = shutil.which("duckdb", path=str(Path(sys.executable).parent))
    assert found, "the DuckDB CLI (duckdb-cli) is a test dependency"
    return found


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four runs, one ingest each; between the second and third, the steps files merged and the
    snapshots expired (the files merged away are scheduled for deletion); an orphan Parquet
    file in steps' directory.  The runs' rows stay inlined in the catalog."""
    root = tmp_path_factory.mktemp("portable")
    path = root / "w.duckdb"
    for n in range(2):
        assert ingest([bundle(root, n)], warehouse=path).counts["ingested"] == 1
    with open_warehouse(path) as wh:
        wh.con.execute("CALL ducklake_merge_adjacent_files('lake')")
        wh.con.execute("CALL ducklake_expire_snapshots('lake', older_than => now())")
    for n in range(2, 4):
        assert ingest([bundle(root, n)], warehouse=path).counts["ingested"] == 1
    steps = path / "data" / "main" / "steps"
    shutil.copy2(sorted(steps.glob("*.parquet"))[0], steps / f"ducklake-{uuid.uuid4()}.parquet")
    return path


def test_the_lake_holds_what_checkpoint_writes_and_a_plain_read_only_client_writes_it(
        lake: Path, tmp_path: Path) -> None:
    assert metadata(lake, "SELECT count(*) FROM ducklake_files_scheduled_for_deletion")[0][0] >= 2
    assert metadata(lake, "SELECT count(*) FROM ducklake_data_file WHERE end_snapshot IS NULL "
                          "AND table_id = (SELECT table_id FROM ducklake_table WHERE table_name = 'steps' "
                          "AND end_snapshot IS NULL)")[0][0] == 3  # the merged file and two more
    inlined = [name for (name,) in metadata(lake, "SELECT name FROM sqlite_master WHERE type = 'table' "
                                                  "AND name LIKE 'ducklake_inlined_data_%'")]
    assert any(metadata(lake, f'SELECT count(*) FROM "{name}"')[0][0] for name in inlined)
    # What matrun's readers are guarded against: DuckLake's CHECKPOINT on a read-only attach
    # writes Parquet files before the catalog refuses the change.  Not on every try (once in a
    # CI run it wrote none, beside the other worker; alone it always did): up to 3 fresh copies.
    wrote = []
    for attempt in range(3):
        copy = copy_warehouse(lake, tmp_path / f"copy{attempt}")
        before = {p for p in (copy / "data").rglob("*") if p.is_file()}
        con = plain_connect(copy)
        try:
            with pytest.raises(duckdb.Error):
                con.execute("CHECKPOINT")
        finally:
            con.close()
        wrote.append({p for p in (copy / "data").rglob("*") if p.is_file()} - before)
        if wrote[-1]:
            break
    assert any(wrote), wrote


# -- item 2: any directory, any host, any copy ------------------------------------------------


def test_attach_sql_names_no_place(lake: Path, tmp_path: Path) -> None:
    text = (lake / "attach.sql").read_text()
    assert text == catalog.attach_sql(catalog.layout(lake))
    statements = [line for line in text.splitlines() if not line.startswith("--")]
    assert statements == ["LOAD ducklake;", "LOAD sqlite;",
                          "ATTACH 'ducklake:sqlite:catalog.sqlite' AS lake (READ_ONLY, DATA_PATH 'data/', "
                          "OVERRIDE_DATA_PATH true);",
                          "USE lake;"]
    assert str(lake) not in text and "site-packages" not in text
    elsewhere = copy_warehouse(lake, tmp_path / "elsewhere" / "renamed")
    assert catalog.attach_sql(catalog.layout(elsewhere)) == text
    # every file the catalog lists is named relative to the data path
    assert metadata(lake, "SELECT count(*) FROM ducklake_data_file WHERE NOT path_is_relative") == [(0,)]
    assert metadata(lake, "SELECT count(*) FROM ducklake_delete_file WHERE NOT path_is_relative") == [(0,)]


def test_snapshot_files_are_the_files_ducklake_lists(lake: Path) -> None:
    lay = catalog.layout(lake)
    con = plain_connect(lake)
    try:
        snapshot = catalog.newest_snapshot(con)
        listed = set()
        for schema, table in con.execute("SELECT schema_name, table_name FROM duckdb_tables() "
                                         "WHERE database_name = 'lake'").fetchall():
            for data, delete in con.execute("SELECT data_file, delete_file FROM ducklake_list_files('lake', ?, "
                                            "schema => ?)", [table, schema]).fetchall():
                listed |= {data} | ({delete} if delete else set())
        ours = catalog.snapshot_files(con, lay, snapshot)
    finally:
        con.close()
    assert listed and ours == sorted(listed)
    assert all(Path(p).is_file() and Path(p).is_relative_to(lake / "data") for p in ours)


@contextmanager
def moved_away(path: Path) -> Iterator[None]:
    """The original out of its place for the block: nothing can read or write it there."""
    away = path.with_name(path.name + ".away")
    os.rename(path, away)
    try:
        yield
    finally:
        os.rename(away, path)


def test_the_duckdb_cli_and_python_open_a_moved_copy_with_the_documented_line(lake: Path, tmp_path: Path) -> None:
    expected = run_query(TOTALS, warehouse=lake)[1]
    assert expected == [(4, 1.2)]
    before = state(lake)
    moved = copy_warehouse(lake, tmp_path / "copy")
    (tmp_path / "other" / "place").mkdir(parents=True)
    moved = Path(shutil.move(moved, tmp_path / "other" / "place" / "moved.duckdb"))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    with moved_away(lake):
        cli = subprocess.run(["bash", "-c", f'cd "$1" && {duckdb_cli()} -init attach.sql -csv -c "{TOTALS}"',
                              "_", str(moved)], cwd=elsewhere, env=client_env(), capture_output=True,
                             text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.splitlines()[-2:] == ["runs,seconds", "4,1.2"]
        python = subprocess.run([sys.executable, "-c", (
            "import duckdb, os, sys\n"
            "os.chdir(sys.argv[1])\n"
            "con = duckdb.connect()\n"
            "con.execute(open('attach.sql').read())\n"
            f"print(con.execute('''{TOTALS}''').fetchall())\n"), str(moved)],
            cwd=elsewhere, env=client_env(), capture_output=True, text=True, timeout=300)
        assert (python.returncode, python.stdout) == (0, "[(4, 1.2)]\n"), python.stderr
    assert_unchanged(before, state(lake))
    assert os.listdir(elsewhere) == []


def test_matrun_reads_and_writes_a_copy_and_never_touches_the_original(lake: Path, tmp_path: Path) -> None:
    original = copy_warehouse(lake, tmp_path / "original.duckdb")
    copy = copy_warehouse(original, tmp_path / "somewhere" / "copy.duckdb")
    # the attach.sql an older matrun wrote: the absolute paths of where it was written
    lay = catalog.layout(original)
    old = "".join(f"{s};\n" for s in catalog.attach_statements(lay, read_only=True))
    (original / "attach.sql").write_text(old)
    (copy / "attach.sql").write_text(old)
    before = state(original)

    info = matrun("warehouse", "info", "--warehouse", copy, cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert (f"note: attach.sql is an older matrun's (it names the place it was written in, not where the "
            "warehouse is now); the next write rewrites it (matrun warehouse upgrade)") in info.stdout.splitlines()
    with moved_away(original):
        res = matrun("query", TOTALS, "--format", "csv", "--warehouse", copy, cwd=tmp_path)
        assert (res.returncode, res.stderr, res.stdout) == (0, "", "runs,seconds\n4,1.2\n")
    assert (copy / "attach.sql").read_text() == old  # a reader leaves it

    res = matrun("ingest", bundle(tmp_path, 9), "--warehouse", copy, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    res = matrun("warehouse", "compact", "--warehouse", copy, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (copy / "attach.sql").read_text() == catalog.attach_sql(catalog.layout(copy))
    assert_unchanged(before, state(original))  # not a byte, not a time stamp
    assert metadata(copy, "SELECT count(*) FROM ducklake_data_file WHERE NOT path_is_relative") == [(0,)]

    shutil.rmtree(original)
    res = matrun("query", TOTALS, "--format", "csv", "--warehouse", copy, cwd=tmp_path)
    assert (res.returncode, res.stderr, res.stdout) == (0, "", "runs,seconds\n5,1.5\n")


def test_a_reader_reads_the_snapshot_that_was_newest_when_it_opened(lake: Path, tmp_path: Path) -> None:
    copy = copy_warehouse(lake, tmp_path / "w.duckdb")
    with open_warehouse(copy, read_only=True) as wh:
        assert wh.con.execute("SELECT count(*) FROM runs").fetchone() == (4,)
        assert ingest([bundle(tmp_path, 7)], warehouse=copy).counts["ingested"] == 1
        assert wh.con.execute("SELECT count(*) FROM runs").fetchone() == (4,)
        assert wh.con.execute("SELECT count(*) FROM steps").fetchone() == (4 * STEPS,)
    assert run_query(TOTALS, warehouse=copy)[1] == [(5, 1.5)]  # the next open: the newest


# -- matrun shell ---------------------------------------------------------------------------


def test_matrun_shell_opens_a_moved_warehouse_read_only_from_anywhere(lake: Path, tmp_path: Path) -> None:
    moved = copy_warehouse(lake, tmp_path / "a" / "moved.duckdb")
    before = state(moved)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "HOME": str(tmp_path / "empty-home")}  # no extensions there
    res = matrun("shell", "--warehouse", moved, "--", "-csv", "-c", TOTALS, cwd=tmp_path, env=env)
    assert (res.returncode, res.stdout, res.stderr) == (0, "runs,seconds\n4,1.2\n", "")

    script = (f"{TOTALS};\nCHECKPOINT;\nCALL ducklake_flush_inlined_data('lake');\n"
              f"CALL ducklake_cleanup_old_files('lake', cleanup_all => true);\n"
              f"CALL ducklake_delete_orphaned_files('lake', cleanup_all => true);\n"
              f"COPY runs TO '{tmp_path / 'out.csv'}';\nSET enable_external_access = true;\n"
              "INSERT INTO runs SELECT * FROM runs;\nSELECT 'still here' AS s;\n")
    res = matrun("shell", "--warehouse", moved, "--", "-csv", cwd=tmp_path, env=env, stdin=script)
    assert res.returncode == 1  # the client's own status: statements failed
    assert res.stdout == "runs,seconds\n4,1.2\ns\nstill here\n"
    errors = [line.split(":")[0] for line in res.stderr.splitlines()]
    assert errors == ["Permission Error"] * 3 + ["Invalid Input Error", "Permission Error"] + ["Invalid Input Error"] * 2
    assert "Failed to perform CHECKPOINT" in res.stderr  # the files it would write, and delete, refused
    assert_unchanged(before, state(moved))
    assert not (tmp_path / "out.csv").exists() and os.listdir(temp) == []


def test_matrun_shell_says_what_to_install_without_a_duckdb_cli(lake: Path, tmp_path: Path) -> None:
    env = {**os.environ, "MATRUN_DUCKDB_CLI": str(tmp_path / "nope")}
    res = matrun("shell", "--warehouse", lake, cwd=tmp_path, env=env)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"Error: MATRUN_DUCKDB_CLI names {tmp_path / 'nope'}, which is not an executable "
                          "file; point it at the DuckDB command-line client (pip install duckdb-cli==1.5.5) "
                          "or unset it\n")
    old = tmp_path / "duckdb"
    old.write_text("#!/bin/sh\necho 'v1.4.4 (Andium) 6ddac802ff'\n")
    old.chmod(0o755)
    res = matrun("shell", "--warehouse", lake, cwd=tmp_path, env={**os.environ, "MATRUN_DUCKDB_CLI": str(old)})
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"Error: the DuckDB command-line client {old} is DuckDB v1.4.4; matrun shell needs "
                          "DuckDB v1.5.5, the release of matrun's extensions: pip install duckdb-cli==1.5.5, "
                          "or point MATRUN_DUCKDB_CLI at one\n")
    # matrun run by a Python whose scripts directory has no duckdb, with none on PATH
    assert shutil.which("duckdb", path="/usr/bin:/bin") is None
    bare = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(bare)],
                   check=True, timeout=300)
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "matrun").is_dir())
    env = {k: v for k, v in os.environ.items() if k != "MATRUN_DUCKDB_CLI"}
    env.update(PATH="/usr/bin:/bin", PYTHONPATH=site)
    res = subprocess.run([str(bare / "bin" / "python"), "-m", "matrun.runner.cli.main", "shell", "--warehouse",
                          str(lake)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"Error: no DuckDB command-line client found: no `duckdb` on PATH or in {bare / 'bin'}; "
                          "install it (pip install duckdb-cli==1.5.5) or point MATRUN_DUCKDB_CLI at one\n")


# -- item 3: a read-only query writes nothing -------------------------------------------------


STATEMENTS = [
    "SELECT count(*) FROM runs", "SELECT * FROM baseline", "FROM steps LIMIT 3",
    "CHECKPOINT", "FORCE CHECKPOINT", "CHECKPOINT lake", "CALL checkpoint('lake')", "CALL force_checkpoint('lake')",
    "VACUUM", "VACUUM ANALYZE", "VACUUM runs", "ANALYZE", "ANALYZE runs",
    "PRAGMA table_info('runs')", "PRAGMA database_size", "PRAGMA show_tables", "PRAGMA enable_profiling",
    "PRAGMA force_checkpoint", "SET threads = 1", "RESET threads", "SET VARIABLE x = 1",
    "SET profiling_output = '{out}/profile.json'", "SET allowed_directories = ['{out}']",
    "SET enable_external_access = true",
    "CALL ducklake_flush_inlined_data('lake')", "SELECT * FROM ducklake_flush_inlined_data('lake')",
    "CALL ducklake_merge_adjacent_files('lake')", "CALL ducklake_rewrite_data_files('lake')",
    "CALL ducklake_expire_snapshots('lake', older_than => now())",
    "CALL ducklake_expire_snapshots('lake', versions => [1])",
    "CALL ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "CALL ducklake_delete_orphaned_files('lake', cleanup_all => true)",
    "CALL lake.set_option('data_inlining_row_limit', 0)",
    "CALL ducklake_add_data_files('lake', 'steps', '{data_file}')",
    "EXPORT DATABASE '{out}/export'", "EXPORT DATABASE lake TO '{out}/export2'",
    "COPY runs TO '{out}/runs.csv'", "COPY (SELECT 1) TO '{out}/one.parquet' (FORMAT parquet)",
    "COPY runs FROM '{data_file}'", "COPY FROM DATABASE lake TO memory",
    "ATTACH '{out}/new.duckdb' AS other", "ATTACH 'ducklake:sqlite:{out}/new.sqlite' AS other",
    "ATTACH '{catalog}' AS cat (TYPE sqlite)", "ATTACH ':memory:' AS scratch", "DETACH lake",
    "USE memory; DETACH lake",
    "SELECT * FROM sqlite_scan('{catalog}', 'ducklake_snapshot')",
    "SELECT * FROM query('SELECT * FROM sqlite_' || 'scan(''{catalog}'', ''ducklake_snapshot'')')",
    "CALL sqlite_attach('{catalog}')",
    "SELECT * FROM sqlite_query('__ducklake_metadata_lake', 'DELETE FROM ducklake_snapshot RETURNING 1')",
    "CREATE TEMP TABLE t AS SELECT * FROM runs", "CREATE TEMP VIEW v AS SELECT 1 AS x",
    "CREATE TEMP MACRO m() AS 1", "CREATE TABLE lake.x (i INTEGER)", "CREATE VIEW lake.v AS SELECT 1 AS x",
    "INSERT INTO runs SELECT * FROM runs", "DELETE FROM steps", "UPDATE runs SET status = 'x'",
    "DROP VIEW baseline", "DROP TABLE steps", "ALTER TABLE runs ADD COLUMN z INTEGER",
    "COMMENT ON TABLE runs IS 'x'", "TRUNCATE steps",
    "INSTALL ducklake", "FORCE INSTALL ducklake", "LOAD ducklake", "LOAD '{extension}'", "UPDATE EXTENSIONS",
    "BEGIN TRANSACTION", "BEGIN; CALL ducklake_flush_inlined_data('lake'); COMMIT", "COMMIT", "ROLLBACK",
    "EXPLAIN SELECT * FROM runs", "EXPLAIN ANALYZE SELECT * FROM runs", "DESCRIBE runs", "SHOW TABLES",
    "SUMMARIZE steps", "PREPARE p AS SELECT 1; EXECUTE p",
    "SELECT * FROM read_parquet('{data_file}')", "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM glob('{lake}/*')", "SELECT * FROM read_text('{catalog}')",
]


@pytest.mark.parametrize("template", STATEMENTS)
def test_no_statement_a_reader_runs_changes_a_byte_of_the_warehouse(
        lake: Path, tmp_path: Path, template: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    data_file = next((lake / "data" / "main" / "steps").glob("*.parquet"))
    sql = template.format(out=out, data_file=data_file, catalog=lake / catalog.CATALOG, lake=lake,
                          extension=catalog.extension_path("ducklake"))
    before = state(lake)
    try:
        run_query(sql, warehouse=lake)
    except QueryError:
        pass
    assert_unchanged(before, state(lake))
    assert os.listdir(out) == []
    assert run_query(TOTALS, warehouse=lake)[1] == [(4, 1.2)]  # and the reader still reads


def test_matrun_query_checkpoint_is_refused_and_leaves_no_file(lake: Path, tmp_path: Path) -> None:
    before = state(lake)
    res = matrun("query", "CHECKPOINT", "--warehouse", lake, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.startswith("Error: query failed: Permission Error: Failed to perform CHECKPOINT; in "
                                 "DuckLake:") and "file system operations are disabled" in res.stderr
    res = matrun("query", f"ATTACH '{lake / catalog.CATALOG}' AS cat (TYPE sqlite)", "--warehouse", lake,
                 cwd=tmp_path)
    assert (res.returncode, res.stderr) == (2, "Error: query refused: a read-only query may not ATTACH or "
                                               "DETACH (ATTACH opens a database matrun's guard does not cover)\n")
    res = matrun("query", f"SELECT count(*) FROM sqlite_scan('{lake / catalog.CATALOG}', 'ducklake_snapshot')",
                 "--warehouse", lake, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (2, (
        "Error: query refused: it uses sqlite_scan, a function of DuckDB's sqlite extension, which opens "
        "databases past matrun's guard; read the lake's tables and views (DuckLake's own state: "
        "ducklake_snapshots('lake'), ducklake_table_info('lake'))\n"))
    assert_unchanged(before, state(lake))
    assert os.listdir(tmp_path) == []


# -- item 4: what is not a warehouse is only looked at ------------------------------------------


def _not_a_warehouse(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A path that is not a warehouse, and the reason ``Error:`` gives."""
    path = tmp_path / "w.duckdb"
    if kind == "regular file":
        return Path("/etc/passwd"), "/etc/passwd is not a DuckDB database file"
    if kind == "text catalog.sqlite":
        path.mkdir()
        (path / "catalog.sqlite").write_text("my notes\n")
        return path, f"{path} is a directory but not a matrun warehouse (its catalog.sqlite is not a SQLite database)"
    if kind == "other SQLite catalog.sqlite":
        path.mkdir()
        con = sqlite3.connect(path / "catalog.sqlite")
        con.execute("CREATE TABLE notes (body TEXT)")
        con.execute("INSERT INTO notes VALUES ('mine')")
        con.commit()
        con.close()
        return path, (f"{path} is a directory but not a matrun warehouse (its catalog.sqlite is a SQLite "
                      "database but not a DuckLake catalog)")
    if kind == "empty directory":
        path.mkdir()
        return path, f"{path} is a directory but not a matrun warehouse (it has no catalog.sqlite or warehouse.toml)"
    if kind == "dangling symlink":
        path.symlink_to(tmp_path / "gone")
        return path, f"warehouse {path} is a symbolic link to {tmp_path / 'gone'}, which does not exist"
    if kind == "fifo":
        os.mkfifo(path)
        return path, f"warehouse {path} is neither a warehouse directory nor a file"
    raise AssertionError(kind)


KINDS = ["regular file", "text catalog.sqlite", "other SQLite catalog.sqlite", "empty directory",
         "dangling symlink", "fifo"]


@pytest.mark.parametrize("command", ["query", "ingest", "shell", "warehouse upgrade"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_path_that_is_not_a_warehouse_is_named_and_left_as_it_is(tmp_path: Path, kind: str, command: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    path, reason = _not_a_warehouse(work, kind)
    if command == "ingest":
        args = ["ingest", bundle(tmp_path, 1)]
    elif command == "query":
        args = ["query", "SELECT 1"]
    else:
        args = command.split()
    around = state(path.parent) if path.parent != Path("/etc") else None
    etc = sorted(os.listdir("/etc"))
    trace = tmp_path / "trace.log"
    strace = shutil.which("strace")
    prefix = [strace, "-f", "-qq", "-e", "trace=open,openat,creat,mkdir,unlink,unlinkat,rename,renameat2",
              "-o", str(trace)] if strace else []
    res = subprocess.run([*prefix, *MATRUN, *args, "--warehouse", str(path)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == f"Error: {reason}; point --warehouse at a matrun warehouse or at a new name\n"
    assert sorted(os.listdir("/etc")) == etc
    if around is not None:
        assert_unchanged(around, state(path.parent))
    if strace:
        touched = [line for line in trace.read_text().splitlines() if str(path) in line]
        assert touched or kind in ("dangling symlink", "fifo", "empty directory")
        assert not [line for line in touched if "O_WRONLY" in line or "O_RDWR" in line or "O_CREAT" in line
                    or "mkdir" in line or "unlink" in line or "rename" in line or "creat(" in line], touched


def test_a_read_only_command_creates_no_missing_warehouse_nor_its_parents(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "w.duckdb"
    for args in (["query", "SELECT 1"], ["shell"], ["warehouse", "info"], ["warehouse", "upgrade"]):
        res = matrun(*args, "--warehouse", path, cwd=tmp_path)
        assert (res.returncode, res.stdout) == (2, "")
        assert res.stderr == (f"Error: warehouse {path} does not exist; run `matrun sweep` or `matrun ingest` "
                              "first to create it\n")
    assert os.listdir(tmp_path) == []
    with pytest.raises(NotAWarehouse):
        run_query("SELECT 1", warehouse=path)


def test_a_symlink_to_a_warehouse_is_the_warehouse(lake: Path, tmp_path: Path) -> None:
    target = copy_warehouse(lake, tmp_path / "real.duckdb")
    link = tmp_path / "link.duckdb"
    link.symlink_to(target)
    res = matrun("query", TOTALS, "--format", "csv", "--warehouse", link, cwd=tmp_path)
    assert (res.returncode, res.stderr, res.stdout) == (0, "", "runs,seconds\n4,1.2\n")
    res = matrun("ingest", bundle(tmp_path, 8), "--warehouse", link, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert link.is_symlink() and run_query(TOTALS, warehouse=target)[1] == [(5, 1.5)]


@contextmanager
def read_only_mount(source: Path, target: Path) -> Iterator[Path]:
    """``source`` seen read-only at ``target`` (a bind mount: root only); unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root")
    target.mkdir()
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount --bind -o ro failed: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.parametrize("closed", [False, True], ids=["as-written", "closed-cleanly"])
def test_a_warehouse_on_a_read_only_file_system_is_read_and_not_written(
        lake: Path, tmp_path: Path, closed: bool) -> None:
    source = copy_warehouse(lake, tmp_path / "source.duckdb")
    run_query("SELECT 1", warehouse=source)  # SQLite's -wal and -shm files are there
    if closed:  # as the last writer's clean close leaves it: the log folded in, both files gone
        db.forget_instances(source)
        catalog.checkpoint_local(catalog.layout(source))
        assert not Path(f"{source / catalog.CATALOG}-shm").exists()
    before = state(source)
    with read_only_mount(source, tmp_path / "ro.duckdb") as ro:
        assert not os.access(ro, os.W_OK) or subprocess.run(["touch", str(ro / "x")]).returncode != 0
        res = matrun("query", TOTALS, "--format", "csv", "--warehouse", ro, cwd=tmp_path)
        assert (res.returncode, res.stderr, res.stdout) == (0, "", "runs,seconds\n4,1.2\n")
        res = matrun("shell", "--warehouse", ro, "--", "-csv", "-c", TOTALS, cwd=tmp_path)
        assert (res.returncode, res.stderr, res.stdout) == (0, "", "runs,seconds\n4,1.2\n")
        res = matrun("query", "CHECKPOINT", "--warehouse", ro, cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.startswith("Error: query failed: Permission Error")
        res = matrun("ingest", bundle(tmp_path, 5), "--warehouse", ro, cwd=tmp_path)
        assert (res.returncode, res.stdout) == (1, "")
        assert res.stderr == f"Error: warehouse {ro}: Read-only file system ({ro / '.writer.lock'})\n"
    assert_unchanged(before, state(source))


def test_a_reader_refuses_what_would_need_a_write_and_says_which_command_does_it(tmp_path: Path) -> None:
    stub = tmp_path / "w.duckdb"
    stub.write_bytes(b"")
    with pytest.raises(WarehouseError, match=r"is an empty file an older matrun's creation cut short"):
        run_query("SELECT 1", warehouse=stub)
    assert stub.read_bytes() == b"" and sorted(os.listdir(tmp_path)) == ["w.duckdb"]
    done, version = db.upgrade_warehouse(stub)
    assert done == ["replaced the empty file an older creation cut short with a new warehouse"]
    assert version == len(db.migrations()) and stat.S_ISDIR(os.stat(stub).st_mode)
    assert run_query("SELECT count(*) FROM runs", warehouse=stub)[1] == [(0,)]
