"""Opening the warehouse: a DuckLake of Parquet files and a catalog (docs/WAREHOUSE.md "Storage").

A warehouse is a directory: ``catalog.sqlite`` (DuckLake's catalog, in SQLite's
write-ahead-log mode), ``data/`` (the Parquet files DuckLake writes) and ``attach.sql`` (the
statements any DuckDB client runs to read it).  Every open is an in-memory DuckDB connection
that loads the DuckLake and SQLite extensions from their PyPI packages (by path: nothing is
downloaded) and attaches the lake as ``lake``, in use, so SQL names its tables plainly.

Readers never lock anything: each query reads one snapshot of the catalog, so a reader sees
every ingest whole or not at all, at any moment of a sweep.  Writers take ``.writer.lock``
(``flock``) for as long as they are open, so two matrun writers on one host queue instead of
failing; a reader never makes a writer wait.  A warehouse whose ``warehouse.toml`` names a
PostgreSQL catalog (several hosts, one warehouse) takes no file lock: DuckLake's own
transactions order its writers (:mod:`matrun.warehouse.catalog`).

A writer applies pending migrations (``migrations/NNN_name.sql``, once each, in a transaction,
recorded in ``schema_migrations``) and re-creates the views from ``views/<name>.sql`` and the
macros they call: the framework facts rendered from ``images/*/framework.toml``
(``framework_sql``), then ``views/_macros.sql``.  A read-only connection changes nothing: it
is pinned to one snapshot and may open only that snapshot's files (DuckDB's external access
off but for them), so SQL typed by a user can neither read other files nor write any, in the
warehouse or elsewhere.  Every path is taken from where the warehouse is now, so a warehouse
that was moved or copied reads and writes its own catalog and data.

A new warehouse is built beside its path and renamed into place, so a creation cut short
never leaves a half-made warehouse.  A warehouse of the single-file format (a DuckDB file at
the path, matrun's schema 1 to 4) is upgraded by the first writer that opens it: its rows are
copied into a new lake built beside it, the old file is kept inside the new directory as
``legacy.duckdb``, and the directory takes the file's place.  A file an older creation cut
short (0 bytes, or only part of DuckDB's header) held nothing and a writer replaces it.  A
reader only looks at what the path holds (reading a few bytes), so a path that is not a
warehouse (``/etc/passwd``) is named as such, with nothing opened to write or made beside it.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import fcntl
import functools
import glob
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

import duckdb

from matrun.errors import InputError, NotAWarehouse, WarehouseError, WarehouseLocked
from matrun.warehouse import catalog, framework_sql, materialise

#: Marks the views this module owns, so re-creating them never touches a user's own views.
VIEW_COMMENT_PREFIX = "matrun view: "
MACRO_FILE = "_macros.sql"
#: A macro whose body is the digest of the macro and view SQL last created, so a writer
#: connect whose views are already current skips re-creating them.
DIGEST_MACRO = "matrun_views_digest"
#: A macro listing the names of the macros matrun created (DuckLake keeps no comment on a
#: macro), so re-creating them never touches a user's own macros.
OWNED_MACROS = "matrun_macros"
#: The name the lake is attached under in every connection (and in ``attach.sql``).
LAKE = "lake"

_MIGRATION_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql\Z")
_VIEW_FILE = re.compile(r"^([a-z][a-z0-9_]*)\.sql\Z")
_MACRO = re.compile(r"^\s*CREATE\s+OR\s+REPLACE\s+MACRO\s+([a-z][a-z0-9_]*)\s*\(.*?\)\s+AS\s+(TABLE\b)?",
                    re.I | re.S)
_RETRY_S = 0.1
#: A writer waits at least this long for another writer (they hold the lock for seconds).
WRITER_WAIT_S = 120.0
#: DuckDB writes its main header and its two database headers (4 KiB each) before anything
#: else, so a shorter file never held a committed transaction.
DUCKDB_HEADER_BYTES = 3 * 4096
_DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of the main header
_SCRATCH = ".{name}.creating-"  # + "<host>-<pid>-<token>": a warehouse being built beside its path
_LONG_PATH = 200  # longer paths are shortened in messages
#: The oldest schema a single-file warehouse can be upgraded from, and the newest.
LEGACY_SCHEMAS = range(1, 5)
LEGACY_NAME = "legacy.duckdb"
#: A DuckDB release newer than this matrun's writes a storage format this one cannot read; the
#: previous matrun installed DuckDB 2.0.0.  Its single-file warehouses are read by that
#: DuckDB, installed beside matrun by the set-up (``make``: ``<venv>/legacy-duckdb``) or
#: wherever this variable points, in a subprocess that exports their tables as Parquet.
LEGACY_DUCKDB_ENV = "MATRUN_LEGACY_DUCKDB"
LEGACY_DUCKDB_VERSION = "2.0.0"
_NEWER_FORMAT = "created with an newer version of DuckDB"
_EXPORT_LEGACY = """
import sys
import duckdb
source, out = sys.argv[1], sys.argv[2]
con = duckdb.connect(source, read_only=True)
for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                            "AND NOT internal").fetchall():
    target = (out + "/" + table + ".parquet").replace("'", "''")
    con.execute('COPY (SELECT * FROM "' + table + '") TO ' + "'" + target + "' (FORMAT parquet)")
con.close()
"""


@dataclass(frozen=True)
class Warehouse:
    """An open warehouse: ``con`` is the DuckDB connection, valid inside the ``with``."""

    path: Path
    con: duckdb.DuckDBPyConnection
    read_only: bool


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@contextmanager
def open_warehouse(path: Path | str, *, read_only: bool = False,
                   wait_s: float = 0.0) -> Iterator[Warehouse]:
    """Open the warehouse at ``path`` for the duration of a ``with`` block.

    A writer creates it if needed (built beside the path, then renamed into place), waits for
    another writer (up to ``max(wait_s, WRITER_WAIT_S)`` seconds, then
    :class:`WarehouseLocked`), applies pending migrations and re-creates the views; it
    upgrades a single-file warehouse first.  A reader waits for nothing and writes nothing: it
    reads the snapshot that was newest when it opened, through a connection that may open only
    that snapshot's files; a path that is not a warehouse raises :class:`NotAWarehouse`, a
    single-file warehouse ``WarehouseError`` saying which command upgrades it.  A full disk
    raises ``WarehouseError("no space left on device: W; …")``; a path the system refuses (too
    long) raises ``InputError``.
    """
    path = Path(path)
    _prepare(path, read_only=read_only, wait_s=wait_s)
    layout = catalog.layout(path)
    if read_only:
        con = _connect(layout, read_only=True)
        key = _instance_key(layout, read_only=True)
        pinned = _INSTANCES[key][1] if key in _INSTANCES else None
        try:
            # once per reader instance: it is pinned to one snapshot, so what it found stays so
            stale = False
            if key not in _CHECKED or _CHECKED[key] != pinned:
                _check_schema_readable(con, path)
                stale = not views_current(con)
                if not stale:
                    _CHECKED[key] = pinned
        except duckdb.Error as exc:
            con.close()
            raise WarehouseError(f"warehouse {shown(path)}: {_first_line(exc)}") from None
        except BaseException:
            con.close()
            raise
        if stale:  # written by another matrun version: bring its views up to date, then read
            con.close()
            _refresh_views(layout, wait_s)
            con = _connect(layout, read_only=True)
        try:
            yield Warehouse(path=path, con=con, read_only=True)
        finally:
            con.close()
        return
    with _writer_lock(layout, wait_s):
        con = _connect(layout, read_only=False)
        try:
            try:
                apply_migrations(con, path)
                create_views(con, path)
                catalog.write_attach_sql(layout)
            except duckdb.Error as exc:
                raise database_error(path, exc) from None
            except OSError as exc:
                raise os_error(path, exc) from None
            yield Warehouse(path=path, con=con, read_only=False)
        finally:
            con.close()


def upgrade_warehouse(path: Path | str, *, wait_s: float = 0.0) -> tuple[list[str], int]:
    """Bring the warehouse at ``path`` up to this matrun now, as its next writer would: upgrade
    a single-file warehouse (or replace the empty file an older creation cut short), finish an
    upgrade cut short, apply pending migrations, re-create the views, rewrite an older
    ``attach.sql``.  Returns what was done beyond the migrations and views, in words, and the
    schema version.  A path holding nothing is not created: :class:`NotAWarehouse`."""
    path = Path(path)
    try:
        kind = _kind(path)
    except OSError as exc:
        raise os_error(path, exc) from None
    if kind == "missing" and not any((Path(name) / LEGACY_NAME).is_file() for name in _upgrades_beside(path)):
        raise NotAWarehouse(f"warehouse {shown(path)} does not exist; run `matrun sweep` or `matrun "
                            "ingest` first to create it")
    old_attach = kind == "warehouse" and catalog.stale_attach_sql(catalog.layout(path))
    with open_warehouse(path, wait_s=wait_s) as wh:
        version = max(_applied_versions(wh.con), default=0)
    done = {"missing": ["finished an upgrade from the single-file format that was cut short"],
            "unfinished": ["replaced the empty file an older creation cut short with a new warehouse"],
            "single-file": ["upgraded it from the single-file format; the old file is "
                            f"{shown(path / LEGACY_NAME)}"]}.get(kind, [])
    if old_attach:
        done.append(f"rewrote {catalog.ATTACH_SQL}: it named the place an older matrun wrote it in")
    return done, version


def _prepare(path: Path, *, read_only: bool, wait_s: float) -> None:
    """Make sure ``path`` is a warehouse directory.  A reader only looks: it writes nothing,
    creates nothing and opens nothing for writing, so it names what it found instead (a
    single-file warehouse to upgrade, a file an older creation cut short, something that is
    not a warehouse).  A writer finishes or runs the upgrade of a single-file warehouse,
    replaces a file an older creation cut short, and creates a missing warehouse (and its
    parent directories)."""
    try:
        if read_only:
            _check_readable(path)
            return
        kind = _kind(path)
        if kind == "missing":
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(path)
            _finish_upgrade(path)
            kind = _kind(path)
        else:
            _remove_abandoned(path)
        if kind == "missing":
            _create(path)
        elif kind == "unfinished":
            _replace_unfinished(path)
        elif kind == "single-file":
            _upgrade(path, wait_s)
    except OSError as exc:
        raise os_error(path, exc) from None
    except duckdb.Error as exc:
        raise database_error(path, exc) from None


def _kind(path: Path) -> str:
    """What is at ``path``, found by reading only: ``missing``, ``warehouse`` (a directory),
    ``unfinished`` (the file an older creation cut short), ``single-file`` (a DuckDB file: an
    older matrun's warehouse, checked when it is upgraded); anything else raises
    :class:`NotAWarehouse` naming it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise NotAWarehouse(f"warehouse {shown(path)} is a symbolic link to {shown(os.readlink(path))}, "
                                "which does not exist; point --warehouse at a matrun warehouse or at a "
                                "new name") from None
        return "missing"
    if stat.S_ISDIR(st.st_mode):
        problem = catalog.warehouse_problem(path)
        if problem is not None:
            raise NotAWarehouse(f"{shown(path)} is a directory but not a matrun warehouse ({problem}); "
                                "point --warehouse at a matrun warehouse or at a new name")
        return "warehouse"
    if not stat.S_ISREG(st.st_mode):
        raise NotAWarehouse(f"warehouse {shown(path)} is neither a warehouse directory nor a file; "
                            "point --warehouse at a matrun warehouse or at a new name")
    if unfinished(path):
        return "unfinished"
    with open(path, "rb") as fh:  # read-only: a file that is not DuckDB's is never opened to write
        head = fh.read(12)
    if len(head) < 12 or head[8:12] != _DUCKDB_MAGIC:
        raise NotAWarehouse(f"{shown(path)} is not a DuckDB database file; point --warehouse at a "
                            "matrun warehouse or at a new name")
    return "single-file"


def _check_readable(path: Path) -> None:
    """A reader's :func:`_prepare`: ``path`` must be a warehouse directory now."""
    kind = _kind(path)
    if kind == "missing":
        cut_short = any((Path(name) / catalog.UPGRADED).is_file() for name in _upgrades_beside(path))
        raise NotAWarehouse(
            f"warehouse {shown(path)} does not exist; "
            + ("its upgrade was cut short: a command that writes to it finishes it (matrun warehouse "
               f"upgrade --warehouse {shown(path)})" if cut_short else
               "run `matrun sweep` or `matrun ingest` first to create it"))
    if kind == "unfinished":
        raise WarehouseError(f"warehouse {shown(path)} is an empty file an older matrun's creation cut "
                             "short (it holds no runs); a command that writes replaces it with a new "
                             f"warehouse: matrun warehouse upgrade --warehouse {shown(path)}, or an "
                             "ingest or sweep into it")
    if kind == "single-file":
        _check_legacy(path)  # read-only: a DuckDB file that is not matrun's is named as such
        raise WarehouseError(f"warehouse {shown(path)} is in the single-file format of an older matrun; "
                             "a read-only command leaves it as it is, a command that writes upgrades "
                             "it (its runs kept, the old file inside as legacy.duckdb): matrun warehouse "
                             f"upgrade --warehouse {shown(path)}")


# -- errors ------------------------------------------------------------------------------


def shown(path: Path | str) -> str:
    """``path`` for a message: as it is, or cut to its start and length when very long."""
    text = str(path)
    return text if len(text) <= _LONG_PATH else f"{text[:60]}… ({len(text)} characters)"


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (an ``OSError`` or a DuckDB error) says the disk is full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return ("No space left on device" in text or "Disk quota exceeded" in text
            or "database or disk is full" in text)


def no_space_error(path: Path, detail: str = "nothing was written to it; free some space and "
                                             "run the command again") -> WarehouseError:
    """The error for a full disk under warehouse ``path``."""
    return WarehouseError(f"no space left on device: {shown(path)}; {detail}")


def database_error(path: Path, exc: BaseException) -> WarehouseError:
    """A DuckDB error while writing ``path`` as a ``WarehouseError`` (a full disk said so)."""
    if is_no_space(exc):
        return no_space_error(path)
    return WarehouseError(f"warehouse {shown(path)}: {_first_line(exc)}")


def os_error(path: Path, exc: OSError) -> WarehouseError | InputError:
    """An ``OSError`` on the warehouse's path as a matrun error naming the path."""
    if is_no_space(exc):
        return no_space_error(path)
    if exc.errno == errno.ENAMETOOLONG:
        return InputError(f"warehouse {shown(path)}: file name too long")
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return WarehouseError(f"warehouse {shown(path)}: {exc.strerror or exc}{where}")


def rolled_back(exc: duckdb.Error, doing: str, again: str = "run the command again") -> WarehouseError:
    """The error of a write transaction that failed and was rolled back: ``doing`` (``registering
    study A6``) wrote nothing; a full disk says so, with ``again`` (what to do once space is freed)."""
    if is_no_space(exc):
        return WarehouseError(f"no space left on device: {doing} wrote nothing; free some space and {again}")
    return WarehouseError(f"{doing} failed and was rolled back: {_first_line(exc)}")


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if DuckDB has not already (a failed COMMIT has)."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- connecting --------------------------------------------------------------------------


#: Open DuckDB instances with a lake attached, by (process, warehouse, catalog file, mode),
#: with the snapshot a reader's is pinned to (None for a writer's): loading the two
#: extensions costs about 0.15 s, so each ``open_warehouse`` takes a new connection (a cursor)
#: of its process's instance instead of a new instance, while the catalog has no newer snapshot.
_INSTANCES: dict[tuple[object, ...], tuple[duckdb.DuckDBPyConnection, int | None]] = {}
_MAX_INSTANCES = 8


#: The reader instances whose schema version and views :func:`open_warehouse` found current,
#: with the snapshot the instance is pinned to: checked once per instance, not on every open
#: (the two checks were about a quarter of a light test's CPU time, most queries being reads of
#: a warehouse whose instance this process has already; benchmarks/reader_checks.py).
_CHECKED: dict[tuple[object, ...], int | None] = {}


def _instance_key(layout: catalog.Layout, *, read_only: bool) -> tuple[object, ...]:
    return (os.getpid(), str(layout.path), layout.catalog, _catalog_identity(layout), read_only)


def _connect(layout: catalog.Layout, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A connection with the lake attached and in use.  A reader's instance is pinned to the
    snapshot that was newest when it was made (:func:`reader_statements`): a newer one in the
    catalog makes a new instance."""
    key = _instance_key(layout, read_only=read_only)
    cached = _INSTANCES.get(key)
    if cached is not None:
        base, pinned = cached
        try:
            con = base.cursor()
            if pinned is None or catalog.newest_snapshot(con) == pinned:
                con.execute(f"USE {LAKE}")
                return con
            con.close()
        except duckdb.Error:
            pass
        _forget(key)
    base, pinned = _instance(layout, read_only=read_only)
    while len(_INSTANCES) >= _MAX_INSTANCES:
        _forget(next(iter(_INSTANCES)))
    _INSTANCES[key] = (base, pinned)
    con = base.cursor()
    con.execute(f"USE {LAKE}")
    return con


def _catalog_identity(layout: catalog.Layout) -> tuple[int, int] | None:
    """The catalog file's (device, inode): a warehouse made anew at the same path is another."""
    if not layout.local:
        return None
    st = _stat(layout.path / catalog.CATALOG)
    return None if st is None else (st.st_dev, st.st_ino)


def _forget(key: tuple[object, ...]) -> None:
    _CHECKED.pop(key, None)
    cached = _INSTANCES.pop(key, None)
    if cached is not None:
        try:
            cached[0].close()
        except duckdb.Error:
            pass


def forget_instances(path: Path | str | None = None) -> None:
    """Close this process's cached instances (of the warehouse at ``path``, or all)."""
    where = None if path is None else str(Path(os.path.abspath(path)))
    for key in list(_INSTANCES):
        if where is None or key[1] == where:
            _forget(key)


def _instance(layout: catalog.Layout, *, read_only: bool) -> tuple[duckdb.DuckDBPyConnection, int | None]:
    """A new DuckDB instance with the lake attached, and the snapshot a reader's is pinned to."""
    try:
        con = catalog.lake_connect()
    except duckdb.Error as exc:
        raise WarehouseError(f"could not open warehouse {shown(layout.path)}: {_first_line(exc)}") from None
    try:
        if not read_only:
            for statement in catalog.attach_statements(layout, read_only=False):
                con.execute(statement)
            return con, None
        statements, pinned = reader_statements(layout, con)
        for statement in statements:
            con.execute(statement)
        return con, pinned
    except duckdb.Error as exc:
        con.close()
        if is_no_space(exc):
            raise no_space_error(layout.path) from None
        raise WarehouseError(f"could not open warehouse {shown(layout.path)}: "
                             f"{_first_line(exc)}") from None
    except BaseException:
        con.close()
        raise


def reader_statements(layout: catalog.Layout,
                      con: duckdb.DuckDBPyConnection) -> tuple[list[str], int]:
    """The statements that make ``con`` (a new instance) a reader of the warehouse, and the
    snapshot they pin it to: the lake attached read-only at the newest snapshot, and only the
    files of that snapshot allowed, with external access off and the configuration locked.

    Read-only in DuckLake stops changes to the catalog, not the files DuckLake writes before
    it commits them (``CHECKPOINT`` flushes inlined rows into new Parquet files, then fails):
    a reader may open exactly the files its snapshot holds, so it can create, change or delete
    nothing under the data path, whatever SQL it runs.  ``con`` attaches the lake to read the
    snapshot and its files, and detaches it; the statements returned do it all again, pinned,
    in ``con`` or in the DuckDB CLI (``matrun shell``).

    SQLite reads a catalog in write-ahead-log mode only with its ``-wal`` and ``-shm`` files
    beside it, which it makes when they are missing (a writer's clean close removes them): on a
    read-only file system, where it cannot, and where no writer can run either, the reader
    attaches a copy of the catalog in a private temporary directory instead."""
    layout = _readable_catalog(layout)
    if layout.local:
        # the catalog's own tables read through the SQLite scanner: 10-50 ms, where attaching
        # the lake first (DuckLake reads its whole catalog) was 250-450 ms of every new reader
        con.execute(f"LOAD {catalog._quote(str(catalog.extension_path('sqlite_scanner')))}")
        con.execute(f"ATTACH {catalog._quote(layout.catalog.removeprefix('sqlite:'))} AS {catalog.METADATA} "
                    "(TYPE sqlite, READ_ONLY)")
        try:
            pinned = catalog.newest_snapshot(con)
            allowed = catalog.snapshot_files(con, layout, pinned)
        finally:
            con.execute(f"DETACH {catalog.METADATA}")
    else:
        for statement in catalog.attach_statements(layout, read_only=True):
            con.execute(statement)
        pinned = catalog.newest_snapshot(con)
        allowed = catalog.snapshot_files(con, layout, pinned)
        con.execute("USE memory")
        con.execute(f"DETACH {LAKE}")
    paths = "[" + ", ".join("'" + path.replace("'", "''") + "'" for path in allowed) + "]"
    *attach, use = catalog.attach_statements(layout, read_only=True, snapshot=pinned)
    return [*attach,
            f"SET allowed_paths = {paths}",
            "SET allowed_directories = []",
            "SET autoinstall_known_extensions = false",
            "SET enable_external_access = false",
            "SET lock_configuration = true",
            use], pinned


def _readable_catalog(layout: catalog.Layout) -> catalog.Layout:
    """``layout``, or, for a local catalog without its ``-shm`` file on a file system that
    cannot be written, the same with the catalog copied to a private temporary directory
    (removed when the process exits)."""
    if not layout.local or os.path.exists(f"{layout.path / catalog.CATALOG}-shm") \
            or os.access(layout.path, os.W_OK):
        return layout
    home = Path(tempfile.mkdtemp(prefix="matrun-catalog-"))
    atexit.register(shutil.rmtree, home, True)
    shutil.copyfile(layout.path / catalog.CATALOG, home / catalog.CATALOG)
    return dataclasses.replace(layout, catalog=f"sqlite:{home / catalog.CATALOG}")


@contextmanager
def _writer_lock(layout: catalog.Layout, wait_s: float) -> Iterator[None]:
    """Hold the warehouse's writer lock (a local catalog's ``.writer.lock``) for the block;
    wait up to ``max(wait_s, WRITER_WAIT_S)`` for another writer.  A PostgreSQL catalog's
    writers are ordered by its transactions and take no file lock."""
    if not layout.local:
        yield
        return
    lock = layout.path / catalog.WRITER_LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only file system, a directory not ours
        raise os_error(layout.path, exc) from None
    try:
        deadline = time.monotonic() + max(wait_s, WRITER_WAIT_S)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                if time.monotonic() > deadline:
                    raise WarehouseLocked(_locked_message(layout.path, fd)) from None
                time.sleep(_RETRY_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _locked_message(path: Path, fd: int) -> str:
    holder = os.pread(fd, 200, 0).decode(errors="replace").split()
    who = f" (pid {holder[1]} on {holder[0]})" if len(holder) == 2 else ""
    return (f"warehouse {shown(path)} is being written by another matrun process{who}; "
            "wait for it to finish or use a different --warehouse")


# -- creating the directory, upgrading a single-file warehouse ---------------------------


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def unfinished(path: Path) -> bool:
    """Whether ``path`` is what a single-file warehouse creation cut short leaves behind, and
    nothing else: a regular file of 0 bytes, or shorter than DuckDB's header and starting
    with it, with no write-ahead log holding anything beside it.  Such a file never held a
    committed transaction, so replacing it loses nothing."""
    st = _stat(path)
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size >= DUCKDB_HEADER_BYTES:
        return False
    wal = _stat(_wal(path))
    if wal is not None and wal.st_size > 0:
        return False
    if st.st_size == 0:
        return True
    with open(path, "rb") as fh:
        head = fh.read(12)
    return len(head) == 12 and head[8:12] == _DUCKDB_MAGIC


def _scratch(path: Path, kind: str = "creating") -> Path:
    return path.with_name(f".{path.name}.{kind}-{socket.gethostname()}-{os.getpid()}-"
                          f"{secrets.token_hex(4)}")


def _copy_template(scratch: Path, path: Path) -> None:
    """A new, empty lake in ``scratch`` (migrations, views), copied from the template (applying
    the migrations and creating the views costs seconds; copying the catalog, milliseconds)."""
    template = _template(path)
    # SQLite's -wal and -shm files are never copied (the template's catalog is checkpointed).
    shutil.copytree(template, scratch, ignore=shutil.ignore_patterns("*-wal", "*-shm"))


def _build(scratch: Path, path: Path) -> duckdb.DuckDBPyConnection:
    """A new, empty lake in ``scratch``; returns its writer connection."""
    _copy_template(scratch, path)
    return _connect(catalog.layout(scratch), read_only=False)


_TEMPLATES: dict[str, Path] = {}
_TEMPLATE_PREFIX = "matrun-lake-template-"
#: Where the empty lakes of each schema are kept for every later process of this user: under
#: matrun's home (``$MATRUN_HOME``, default ``~/.cache/matrun``, as runner.environments.home).
SHARED_TEMPLATES = "lake-templates"
#: Written last into a shared template, with its key: a folder without it is never used.
_TEMPLATE_MARK = ".matrun-template"
#: A shared template of another schema unused this long is removed when a new one is made.
_TEMPLATE_KEEP_S = 14 * 24 * 3600


def _remove_dead_templates() -> None:
    """Remove the templates processes killed before their exit left in the temporary directory."""
    for name in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), _TEMPLATE_PREFIX + "*")):
        pid = os.path.basename(name)[len(_TEMPLATE_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(name, ignore_errors=True)


def _template_key() -> str:
    """The schema, views and macros of this matrun, and the DuckDB and DuckLake that write them."""
    return hashlib.sha256(repr((duckdb.__version__, [m.sql for m in migrations()], view_sql(),
                                macro_sql())).encode()).hexdigest()[:16]


def _shared_templates() -> Path:
    return Path(os.environ.get("MATRUN_HOME") or Path.home() / ".cache" / "matrun") / SHARED_TEMPLATES


def _shared_template(key: str) -> Path | None:
    """The shared template of ``key`` when a process made it whole (its mark names the key)."""
    lake = _shared_templates() / key / "lake"
    try:
        st = os.lstat(lake.parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return None  # only a folder this user made is copied into a warehouse
        if (lake.parent / _TEMPLATE_MARK).read_text(encoding="utf-8") != key:
            return None
    except (OSError, UnicodeDecodeError):
        return None
    if not (lake / catalog.CATALOG).is_file():
        return None
    try:
        os.utime(lake.parent)  # used: kept by the pruning of unused templates (_share_template)
    except OSError:
        pass
    return lake


def _share_template(key: str, lake: Path) -> None:
    """Copy this process's template to matrun's home for the later processes (best effort:
    an unwritable home only means each process builds its own)."""
    root = _shared_templates()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
    except OSError:
        return
    try:
        shutil.copytree(lake, tmp / "lake", ignore=shutil.ignore_patterns("*-wal", "*-shm"))
        (tmp / _TEMPLATE_MARK).write_text(key, encoding="utf-8")
        try:
            os.rename(tmp, root / key)  # whole or not at all; another process's, when first, is kept
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR) \
                    or _shared_template(key) is not None:
                raise
            # a folder of that name that is no template of this user's (half made by hand,
            # another user's): set aside, then this one in its place
            aside = root / f".{key}.invalid-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(root / key, aside)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(tmp, root / key)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    now = time.time()
    for other in root.iterdir() if root.is_dir() else ():
        try:
            if other.name != key and now - other.stat().st_mtime > _TEMPLATE_KEEP_S:
                shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass


def _template(path: Path) -> Path:
    """An empty lake of the current schema and views: built once per user and schema (kept in
    matrun's home, ``lake-templates/<key>``), else once per process in the temporary directory."""
    key = _template_key()
    found = _TEMPLATES.get(key)
    if found is not None and found.is_dir():
        return found
    shared = _shared_template(key)
    if shared is not None:
        _TEMPLATES[key] = shared
        return shared
    _remove_dead_templates()
    home = Path(tempfile.mkdtemp(prefix=f"{_TEMPLATE_PREFIX}{os.getpid()}-"))
    atexit.register(shutil.rmtree, home, True)
    lake = home / "lake"
    lake.mkdir()
    lay = catalog.layout(lake)
    catalog.create_local(lay)
    con, _ = _instance(lay, read_only=False)
    try:
        con.execute(f"USE {LAKE}")
        apply_migrations(con, path)
        create_views(con, path)
    finally:
        con.close()
    catalog.checkpoint_local(lay)
    _TEMPLATES[key] = lake
    _share_template(key, lake)
    return lake


def _create(path: Path) -> None:
    """Build a new warehouse beside ``path`` and rename it into place; when another process
    created one meanwhile, theirs is kept and ours removed."""
    scratch = _scratch(path)
    try:
        _copy_template(scratch, path)  # opened first at its final path: no connection here
        catalog.write_attach_sql(catalog.layout(scratch))
        _fsync(scratch)
        try:
            os.rename(scratch, path)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                raise
            return  # another process created it first: theirs is the warehouse
        _fsync(path.parent)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _replace_unfinished(path: Path) -> None:
    """Replace a file an older single-file creation cut short with a new warehouse."""
    with _upgrade_lock(path, 30.0, "is empty (its creation was cut short) and cannot be recreated here"):
        if not unfinished(path):
            return  # another process replaced it meanwhile
        try:
            _wal(path).unlink()  # empty (unfinished() checked): nothing in it
        except FileNotFoundError:
            pass
        path.unlink()
        _create(path)


@contextmanager
def _upgrade_lock(path: Path, wait_s: float, cannot: str) -> Iterator[None]:
    """One process at a time upgrades (or replaces) the file at ``path``; ``cannot`` says
    what the file is when its directory cannot be written."""
    lock = path.with_name(f".{path.name}.upgrade.lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if is_no_space(exc) or exc.errno == errno.ENAMETOOLONG:
            raise
        raise WarehouseError(f"warehouse {shown(path)} {cannot}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + max(wait_s, WRITER_WAIT_S)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN) or time.monotonic() > deadline:
                    raise WarehouseLocked(f"warehouse {shown(path)} is being upgraded by another "
                                          "matrun process; run the command again once it is done") from None
                time.sleep(_RETRY_S)
        yield
    finally:
        os.close(fd)
        try:
            lock.unlink()
        except FileNotFoundError:
            pass


def _upgrade(path: Path, wait_s: float) -> None:
    """Upgrade the single-file warehouse at ``path`` into a lake (module docstring).  The file
    is first read read-only: one that is not a matrun warehouse is refused before anything is
    written or created beside it."""
    newer = _check_legacy(path)
    with _upgrade_lock(path, wait_s, "is in the single-file format of an older matrun and cannot "
                                     "be upgraded here (run `matrun ingest` on it where it is "
                                     "writable)"):
        st = _stat(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            return  # another process upgraded it meanwhile
        if not newer:
            _fold_legacy_log(path)
        scratch = _scratch(path, "upgrading")
        exported = scratch.with_name(scratch.name + ".export")
        try:
            if newer:
                _export_legacy(path, exported)
            con = _build(scratch, path)
            try:
                _copy_legacy(con, path, exported if newer else None)
            finally:
                con.close()
                forget_instances(scratch)
            catalog.write_attach_sql(catalog.layout(scratch))
            (scratch / catalog.UPGRADED).write_text(f"{path.name}\n", encoding="utf-8")
            _fsync(scratch)
            os.rename(path, scratch / LEGACY_NAME)  # from here on, _finish_upgrade completes it
            os.rename(scratch, path)
            _fsync(path.parent)
        except BaseException:
            if _stat(path) is None and (scratch / LEGACY_NAME).exists():
                os.rename(scratch / LEGACY_NAME, path)  # put the old file back
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(exported, ignore_errors=True)


def _check_legacy(path: Path) -> bool:
    """Check, read-only, that the file at ``path`` is a matrun single-file warehouse this
    matrun can upgrade; True when a newer DuckDB wrote it (it is then read by
    :func:`_export_legacy`, and checked there)."""
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as exc:
        message = str(exc)
        if _NEWER_FORMAT in message:
            return True
        if "Could not set lock on file" in message:
            raise WarehouseLocked(f"warehouse {shown(path)} (single-file format) is open in "
                                  "another process; close it, then run the command again to "
                                  "upgrade it") from None
        if "not a valid DuckDB database file" in message:
            raise NotAWarehouse(f"{shown(path)} is not a DuckDB database file; point --warehouse "
                                "at a matrun warehouse or at a new name") from None
        raise WarehouseError(f"could not open warehouse {shown(path)}: {_first_line(exc)}") from None
    except duckdb.Error as exc:
        raise WarehouseError(f"could not open warehouse {shown(path)}: {_first_line(exc)}") from None
    try:
        tables = {row[0] for row in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
        if "schema_migrations" not in tables:
            raise NotAWarehouse(f"{shown(path)} is a DuckDB file but not a matrun warehouse "
                                "(it has no schema_migrations table)")
        version = max((v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()),
                      default=0)
        _check_legacy_version(path, version)
    except duckdb.Error as exc:
        raise database_error(path, exc) from None
    finally:
        con.close()
    return False


def _fold_legacy_log(path: Path) -> None:
    """Fold the single-file warehouse's write-ahead log (``W.wal``) into it, so no log is left
    beside the path once the file moves into the lake (the upgrade's writer open)."""
    try:
        con = duckdb.connect(str(path))
    except duckdb.IOException as exc:
        if "Could not set lock on file" in str(exc):
            raise WarehouseLocked(f"warehouse {shown(path)} (single-file format) is open in "
                                  "another process; close it, then run the command again to "
                                  "upgrade it") from None
        raise WarehouseError(f"could not open warehouse {shown(path)}: {_first_line(exc)}") from None
    try:
        con.execute("CHECKPOINT")
    except duckdb.Error as exc:
        raise database_error(path, exc) from None
    finally:
        con.close()


def _check_legacy_version(path: Path, version: int) -> None:
    if version > LEGACY_SCHEMAS[-1]:
        raise WarehouseError(f"warehouse {shown(path)} has schema version {version} in the "
                             "single-file format, which this matrun does not know: upgrade matrun")


def legacy_duckdb() -> Path:
    """Where the DuckDB that reads the previous matrun's warehouses is installed."""
    return Path(os.environ.get(LEGACY_DUCKDB_ENV) or Path(sys.prefix) / "legacy-duckdb")


def _export_legacy(path: Path, out: Path) -> None:
    """Export the tables of the single-file warehouse at ``path``, written by a newer DuckDB,
    as Parquet files into ``out`` with that DuckDB (a subprocess)."""
    where = legacy_duckdb()
    if not (where / "duckdb").is_dir():
        raise WarehouseError(
            f"warehouse {shown(path)} is a single-file warehouse written by a newer DuckDB than "
            f"this matrun's {duckdb.__version__}, and no DuckDB that reads it is installed at "
            f"{where}: install one there (pip install --target {where} "
            f"duckdb=={LEGACY_DUCKDB_VERSION}) or point {LEGACY_DUCKDB_ENV} at one, then run the "
            "command again; or rebuild the warehouse from the bundles: matrun ingest RESULTS "
            "--warehouse NEW")
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _EXPORT_LEGACY, str(path), str(out)], env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        if "Could not set lock on file" in last:
            raise WarehouseLocked(f"warehouse {shown(path)} (single-file format) is open in "
                                  "another process; close it, then run the command again to "
                                  "upgrade it")
        raise WarehouseError(f"warehouse {shown(path)}: reading it with DuckDB from {where} "
                             f"failed: {last[:300]}")
    migrations_file = out / "schema_migrations.parquet"
    if not migrations_file.is_file():
        raise WarehouseError(f"{shown(path)} is a DuckDB file but not a matrun warehouse "
                             "(it has no schema_migrations table)")
    con = duckdb.connect()
    try:
        escaped = str(migrations_file).replace("'", "''")
        version = con.execute(f"SELECT max(version) FROM read_parquet('{escaped}')").fetchone()[0]
    finally:
        con.close()
    _check_legacy_version(path, version or 0)


def _copy_legacy(con: duckdb.DuckDBPyConnection, path: Path, exported: Path | None) -> None:
    """Copy every row of the single-file warehouse at ``path`` (or of its tables ``exported``
    as Parquet files) into the lake ``con`` uses, in one transaction: columns by name (an
    older schema's missing ones stay NULL), time stamps as UTC."""
    if exported is None:
        escaped = str(path).replace("'", "''")
        con.execute(f"ATTACH '{escaped}' AS legacy (READ_ONLY)")
    try:
        mine = _table_columns(con, LAKE)
        if exported is None:
            theirs = _table_columns(con, "legacy")
            source = {table: f'legacy.main."{table}"' for table in theirs}
        else:
            source, theirs = {}, {}
            for file in sorted(exported.glob("*.parquet")):
                source[file.stem] = "read_parquet('" + str(file).replace("'", "''") + "')"
                theirs[file.stem] = [row[0] for row in con.execute(
                    f"DESCRIBE SELECT * FROM {source[file.stem]}").fetchall()]
        con.execute("BEGIN TRANSACTION")
        try:
            for table, columns in mine.items():
                if table == "schema_migrations" or table not in theirs:
                    continue
                shared = [c for c in columns if c in theirs[table]]
                names = ", ".join(f'"{c}"' for c in shared)
                con.execute(f'INSERT INTO {LAKE}.main."{table}" ({names}) '
                            f'SELECT {names} FROM {source[table]}')
            materialise.refresh(con, everything=True)  # the views' caches, of the runs copied
            con.execute("COMMIT")
        except BaseException:
            rollback(con)
            raise
    finally:
        if exported is None:
            con.execute("DETACH legacy")


def _table_columns(con: duckdb.DuckDBPyConnection, database: str) -> dict[str, list[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ? "
        "AND schema_name = 'main' AND NOT internal ORDER BY table_name, column_index",
        [database]).fetchall()
    columns: dict[str, list[str]] = {}
    for table, column in rows:
        columns.setdefault(table, []).append(column)
    return columns


def _upgrades_beside(path: Path) -> list[str]:
    """The scratch directories of upgrades of ``path`` beside it (``.W.upgrading-…``)."""
    return sorted(glob.glob(glob.escape(str(path.with_name(f".{path.name}.upgrading-"))) + "*"))


def _finish_upgrade(path: Path) -> None:
    """Complete an upgrade cut short between its two renames: the old file is already inside
    the new directory, which did not yet take the path."""
    if _stat(path) is not None:
        return
    for name in _upgrades_beside(path):
        done = Path(name)
        if (done / catalog.UPGRADED).is_file() and (done / LEGACY_NAME).is_file():
            try:
                os.rename(done, path)
            except OSError:
                continue
            _fsync(path.parent)
            return


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


def _remove_abandoned(path: Path) -> None:
    """Remove what a creation or upgrade killed on this host left beside ``path`` (its
    process is gone; an upgrade whose old file is already inside is finished instead)."""
    for kind in ("creating", "upgrading"):
        prefix = str(path.with_name(f".{path.name}.{kind}-{socket.gethostname()}-"))
        for name in glob.glob(glob.escape(prefix) + "*"):
            pid = name[len(prefix):].split("-")[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            if kind == "upgrading" and (Path(name) / LEGACY_NAME).exists():
                continue  # holds the old file: _finish_upgrade moves it into place
            if os.path.isdir(name):
                shutil.rmtree(name, ignore_errors=True)
            else:  # the single-file format's scratch file (and its log)
                for leftover in (name, name + ".wal"):
                    try:
                        os.unlink(leftover)
                    except FileNotFoundError:
                        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refresh_views(layout: catalog.Layout, wait_s: float) -> None:
    """Re-create the views of a warehouse whose views are not this matrun's (a reader found
    them stale).  Only matrun's own views and macros change; the data is not touched."""
    path = layout.path
    try:
        with _writer_lock(layout, wait_s):
            con = _connect(layout, read_only=False)
            try:
                create_views(con, path)
            finally:
                con.close()
    except WarehouseLocked:
        raise WarehouseError(f"warehouse {shown(path)} has the views of another matrun version and "
                             "is being written now; run `matrun ingest` on it once the writer is "
                             "done") from None
    except OSError as exc:  # e.g. a read-only file system
        if is_no_space(exc):
            raise no_space_error(path) from None
        raise WarehouseError(f"warehouse {shown(path)} has the views of another matrun version and "
                             f"cannot be updated here ({exc.strerror or exc}); run `matrun ingest` "
                             "on it where it is writable") from None
    except duckdb.Error as exc:
        raise database_error(path, exc) from None
    except WarehouseError as exc:
        raise WarehouseError(f"warehouse {shown(path)} has the views of another matrun version and "
                             f"cannot be updated here ({exc}); run `matrun ingest` on it where it "
                             "is writable") from None


# -- migrations --------------------------------------------------------------------------


def migrations() -> list[Migration]:
    """The migrations shipped with this matrun, in version order."""
    found: dict[int, Migration] = {}
    for entry in resources.files("matrun.warehouse").joinpath("migrations").iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise WarehouseError(f"two migrations are numbered {version:03d}: "
                                 f"{found[version].name} and {match.group(2)}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def apply_migrations(con: duckdb.DuckDBPyConnection, path: Path) -> list[int]:
    """Apply each pending migration in its own transaction; return the versions applied."""
    con.execute("""
        CREATE TABLE IF NOT EXISTS schema_migrations (
            version     INTEGER NOT NULL,
            name        VARCHAR NOT NULL,
            applied_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
        )""")
    known = migrations()
    applied = _applied_versions(con)
    _refuse_newer(path, applied, known)
    done = []
    for migration in known:
        if migration.version in applied:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(migration.sql)
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                        [migration.version, migration.name])
            con.execute("COMMIT")
        except duckdb.Error as exc:
            rollback(con)
            if is_no_space(exc):
                raise no_space_error(path) from None
            raise WarehouseError(f"warehouse {path}: migration {migration.version:03d}_"
                                 f"{migration.name}.sql failed: {_first_line(exc)}") from None
        done.append(migration.version)
    if done:
        _prime_empty_tables(con, path)
    return done


#: A value of each type a NOT NULL column may have, for :func:`_prime_empty_tables`.
_PRIME_VALUES = {"VARCHAR": "''", "JSON": "'{}'", "BOOLEAN": "false", "TIMESTAMP": "TIMESTAMP '1970-01-01'",
                 "DATE": "DATE '1970-01-01'", "INTEGER": "0", "BIGINT": "0", "SMALLINT": "0",
                 "TINYINT": "0", "UBIGINT": "0", "UINTEGER": "0", "HUGEINT": "0", "DOUBLE": "0", "FLOAT": "0"}


def _prime_empty_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Write a row into each empty table and delete it, in one transaction.  DuckLake binds a
    table that never held a row slowly, about 3 ms per column in every statement that names
    it (`SELECT * FROM runs` planned in 130 ms instead of 3 ms), which a new warehouse's first
    ingests and their view refresh would pay for every table they touch."""
    tables = [t for (t,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND estimated_size = 0 ORDER BY table_name").fetchall()]
    con.execute("BEGIN TRANSACTION")
    try:
        for table in tables:
            if con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]:
                continue
            required = con.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND table_name = ? AND NOT is_nullable ORDER BY column_index",
                [table]).fetchall()
            if any(kind not in _PRIME_VALUES for _, kind in required):
                continue  # a type without a value here: left as it is (only slower)
            if required:
                names = ", ".join(f'"{name}"' for name, _ in required)
                values = ", ".join(_PRIME_VALUES[kind] for _, kind in required)
                con.execute(f'INSERT INTO "{table}" ({names}) VALUES ({values})')
            else:
                con.execute(f'INSERT INTO "{table}" DEFAULT VALUES')
            con.execute(f'DELETE FROM "{table}"')
        con.execute("COMMIT")
    except duckdb.Error as exc:
        rollback(con)
        if is_no_space(exc):
            raise no_space_error(path) from None
        raise WarehouseError(f"warehouse {path}: preparing its tables failed: {_first_line(exc)}") from None


def _applied_versions(con: duckdb.DuckDBPyConnection) -> set[int]:
    return {row[0] for row in con.execute("SELECT version FROM schema_migrations").fetchall()}


def _refuse_newer(path: Path, applied: set[int], known: list[Migration]) -> None:
    newest = known[-1].version if known else 0
    if applied and max(applied) > newest:
        raise WarehouseError(f"warehouse {path} has schema version {max(applied)}; this matrun "
                             f"knows up to {newest}: upgrade matrun")


def _check_schema_readable(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    tables = {row[0] for row in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
        "AND database_name = current_database()").fetchall()}
    if "schema_migrations" not in tables:
        raise WarehouseError(f"{path} is a DuckDB file but not a matrun warehouse "
                             "(it has no schema_migrations table)")
    known = migrations()
    applied = _applied_versions(con)
    _refuse_newer(path, applied, known)
    pending = [m.version for m in known if m.version not in applied]
    if pending:
        raise WarehouseError(f"warehouse {path} was written by an older matrun (schema version "
                             f"{max(applied, default=0)}, this matrun has {known[-1].version}); "
                             "run `matrun ingest` on it once to upgrade it")


# -- views -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[dict[str, str], list[tuple[str, bool, str]], str, list[str]]:
    """This matrun's views, macros, their digest and the views' creation order (read once)."""
    views, macros = created_views(), macro_sql()
    return views, macros, _views_digest(views, macros), _dependency_order(views)


def _quick_current(con: duckdb.DuckDBPyConnection) -> bool:
    """One query: the digest macro holds this matrun's digest and every view and macro of it
    is there (what :func:`create_views` and a reader check first)."""
    views, macros, digest, _ = _shipped()
    names = sorted({name for name, _, _ in macros} | {DIGEST_MACRO, OWNED_MACROS})
    try:
        row = con.execute(
            f"SELECT {DIGEST_MACRO}(), "
            "(SELECT count(*) FROM duckdb_views() WHERE schema_name = 'main' AND database_name = "
            "current_database() AND starts_with(comment, ?) AND list_contains(?, view_name)), "
            "(SELECT count(DISTINCT function_name) FROM duckdb_functions() WHERE schema_name = 'main' "
            "AND database_name = current_database() AND list_contains(?, function_name))",
            [VIEW_COMMENT_PREFIX, list(views), names]).fetchone()
    except duckdb.CatalogException:
        return False  # no digest macro yet
    return row == (digest, len(views), len(names))


def view_sql() -> dict[str, str]:
    """``{view name: SELECT …}`` for every ``views/<name>.sql``, sorted by name."""
    views = {}
    for entry in resources.files("matrun.warehouse").joinpath("views").iterdir():
        match = _VIEW_FILE.match(entry.name)
        if match:
            body = entry.read_text(encoding="utf-8").strip()
            views[match.group(1)] = body[:-1].rstrip() if body.endswith(";") else body
    return dict(sorted(views.items()))


def created_views() -> dict[str, str]:
    """``{view name: SELECT …}`` of every view matrun creates: those of :func:`view_sql`, where
    a view kept in a cache (``materialise.CACHED``) is created twice: ``<name>_live`` computes
    it (its ``views/<name>.sql``), ``<name>`` reads the cache of it."""
    views = {}
    for name, sql in view_sql().items():
        cache = materialise.CACHED_BY_VIEW.get(name)
        if cache is None:
            views[name] = sql
        else:
            views[cache.live] = sql
            # the comment names the live view: created first (_dependency_order)
            views[name] = f"-- the rows of {cache.live}, kept in {cache.table}\n{materialise.public_sql(cache)}"
    return dict(sorted(views.items()))


def macro_sql() -> list[tuple[str, bool, str]]:
    """``(name, is_table_macro, CREATE OR REPLACE MACRO …)`` for each framework macro
    (``framework_sql``, rendered from the framework data) and then each statement of
    ``views/_macros.sql``, in file order (a statement ends with a semicolon at a line end)."""
    macros = [(name, False, sql) for name, sql in framework_sql.framework_macros()]
    entry = resources.files("matrun.warehouse").joinpath("views", MACRO_FILE)
    if not entry.is_file():
        return macros
    text = "\n".join(line for line in entry.read_text(encoding="utf-8").splitlines()
                     if not line.lstrip().startswith("--"))
    for statement in re.split(r";[ \t]*\n", text + "\n"):
        if not statement.strip():
            continue
        match = _MACRO.match(statement)
        if not match:
            raise WarehouseError(f"views/{MACRO_FILE}: every statement must be CREATE OR REPLACE "
                                 f"MACRO name(...) AS ...; got: {statement.strip()[:60]}")
        macros.append((match.group(1), bool(match.group(2)), statement.strip()))
    return macros


def _views_digest(views: dict[str, str], macros: list[tuple[str, bool, str]]) -> str:
    return hashlib.sha256(repr((duckdb.__version__, macros, views)).encode()).hexdigest()


def _owned(con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[tuple[str, str]]]:
    """The views (marked by their comment) and macros (listed by ``OWNED_MACROS``) matrun
    created in this warehouse, the macros with their kind."""
    views = [name for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' "
        "AND database_name = current_database() AND starts_with(comment, ?)",
        [VIEW_COMMENT_PREFIX]).fetchall()]
    present = dict(con.execute(
        "SELECT DISTINCT function_name, function_type FROM duckdb_functions() "
        "WHERE schema_name = 'main' AND database_name = current_database() "
        "AND function_type IN ('macro', 'table_macro')").fetchall())
    listed = con.execute(f"SELECT {OWNED_MACROS}()").fetchone()[0] if OWNED_MACROS in present else []
    names = [*listed, OWNED_MACROS, DIGEST_MACRO]
    return views, [(name, present[name]) for name in names if name in present]


def _current(con, views, macros, old, old_macros, digest) -> bool:
    return (set(old) == set(views)
            and {name for name, _ in old_macros} == {name for name, _, _ in macros} | {DIGEST_MACRO, OWNED_MACROS}
            and con.execute(f"SELECT {DIGEST_MACRO}()").fetchall() == [(digest,)])


def views_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the warehouse holds exactly this matrun's views and macros."""
    if not _quick_current(con):
        return False
    views, macros, digest, _ = _shipped()
    old, old_macros = _owned(con)
    return _current(con, views, macros, old, old_macros, digest)


def create_views(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Drop the views and macros matrun made before and create the current ones (macros
    first, then views in dependency order), in one transaction.  Nothing is done when the
    warehouse already has exactly the current ones (same SQL digest, every view and macro
    present)."""
    views, macros, digest, order = _shipped()
    con.execute("BEGIN TRANSACTION")
    try:
        if _quick_current(con):
            con.execute("COMMIT")
            return
        old, old_macros = _owned(con)
        if _current(con, views, macros, old, old_macros, digest):
            con.execute("COMMIT")
            return
        for name in old:
            con.execute(f'DROP VIEW IF EXISTS "{name}"')
        for name, kind in old_macros:
            con.execute(f'DROP MACRO {"TABLE " if kind == "table_macro" else ""}IF EXISTS "{name}"')
        names = ", ".join(f"'{name}'" for name, _, _ in macros)
        statements = [(DIGEST_MACRO, False, f"CREATE OR REPLACE MACRO {DIGEST_MACRO}() AS '{digest}'"),
                      *macros,  # after the digest: caches_current reads it
                      (OWNED_MACROS, False, f"CREATE OR REPLACE MACRO {OWNED_MACROS}() AS [{names}]::VARCHAR[]")]
        rendered = {name for name, _ in framework_sql.framework_macros()}
        for name, _, sql in statements:
            source = framework_sql.SOURCE if name in rendered else f"views/{MACRO_FILE}"
            try:
                con.execute(sql)
            except duckdb.Error as exc:
                raise WarehouseError(f"warehouse {path}: macro {name} ({source}) failed: "
                                     f"{_first_line(exc)}") from None
        for name in order:
            cache = materialise.CACHED_BY_VIEW.get(name)
            source = name.removesuffix("_live") if materialise.is_live_view(name) else name
            try:
                if cache is not None:  # its table, with the live view's columns, filled below
                    con.execute(f'CREATE OR REPLACE TABLE "{cache.table}" AS SELECT * FROM "{cache.live}" LIMIT 0')
                    # DuckLake reads a table that never held a row slowly (about 12 ms more per
                    # statement that names it): a row written and deleted spares the ingests that
                    con.execute(f'INSERT INTO "{cache.table}" DEFAULT VALUES')
                    con.execute(f'DELETE FROM "{cache.table}"')
                con.execute(f'CREATE OR REPLACE VIEW "{name}" AS\n{views[name]}\n')
            except duckdb.Error as exc:
                raise WarehouseError(f"warehouse {path}: view {name} (views/{source}.sql) failed: "
                                     f"{_first_line(exc)}") from None
            con.execute(f"COMMENT ON VIEW \"{name}\" IS '{VIEW_COMMENT_PREFIX}views/{source}.sql'")
        try:  # other views (their cache tables made anew): the caches computed again, whole
            materialise.refresh(con, everything=True)
        except duckdb.Error as exc:
            raise WarehouseError(f"warehouse {path}: filling the caches of the views failed: "
                                 f"{_first_line(exc)}") from None
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def _dependency_order(views: dict[str, str]) -> list[str]:
    """Views that read other views come after them (a view may build on another)."""
    # A view reads another when the other's name is one of its words (``\\b name \\b``): the
    # words of each view once, not one search per pair (a fresh process pays this on every open).
    words = {name: set(re.findall(r"\w+", sql)) for name, sql in views.items()}
    deps = {name: {other for other in views if other != name and other in words[name]}
            for name in views}
    for cache in materialise.CACHED:  # a cached view reads its live view's table; the live
        if cache.view in deps:        # view's own words about the view are no reading of it
            deps[cache.view] = {cache.live, *(d for d in deps[cache.view] if d != cache.live)}
            deps[cache.live].discard(cache.view)
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise WarehouseError(f"views/{name}.sql is part of a cycle of views reading each other")
        visiting.add(name)
        for dep in sorted(deps[name]):
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in views:
        visit(name)
    return order
