"""Opening the DuckDB warehouse: locking, migrations and views (docs/WAREHOUSE.md).

A writer connection applies pending migrations (``migrations/NNN_name.sql``, once each, in
a transaction, recorded in ``schema_migrations``) and re-creates the views from
``views/<name>.sql`` and the macros they call: the framework facts rendered from
``images/*/framework.toml`` (``framework_sql``), then ``views/_macros.sql``.  A read-only
connection changes nothing and runs with DuckDB's external access off, so SQL typed by a
user cannot read or write files.

A new warehouse is built beside its path (``.<name>.creating-<host>-<pid>-<token>``),
migrated and checkpointed there, and only then moved into place, so a creation cut short (a
full disk, a kill) never leaves a half-made file at the path.  A file such a cut leaves behind (0 bytes,
or only the first part of DuckDB's header: it never held a committed transaction) is
recreated by the next open.  A full disk is reported as ``no space left on device: W``.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

import duckdb

from matrun.errors import InputError, WarehouseError, WarehouseLocked
from matrun.warehouse import framework_sql

#: Marks the views this module owns, so re-creating them never touches a user's own views.
VIEW_COMMENT_PREFIX = "matrun view: "
#: Marks the SQL macros of ``views/_macros.sql`` (and the framework macros) the same way.
MACRO_COMMENT_PREFIX = "matrun macro: "
MACRO_FILE = "_macros.sql"
#: A macro whose body is the digest of the macro and view SQL last created, so a writer
#: connect whose views are already current skips re-creating them (binding the statistics
#: views takes about half a second).
DIGEST_MACRO = "matrun_views_digest"

_MIGRATION_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql\Z")
_VIEW_FILE = re.compile(r"^([a-z][a-z0-9_]*)\.sql\Z")
_MACRO = re.compile(r"^\s*CREATE\s+OR\s+REPLACE\s+MACRO\s+([a-z][a-z0-9_]*)\s*\(.*?\)\s+AS\s+(TABLE\b)?",
                    re.I | re.S)
_LOCK_PID = re.compile(r"\(PID (\d+)\)")
_RETRY_S = 0.1
#: DuckDB writes its main header and its two database headers (4 KiB each) before anything
#: else, so a shorter file never held a committed transaction.
DUCKDB_HEADER_BYTES = 3 * 4096
_DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of the main header
_SCRATCH = ".{name}.creating-"  # + "<host>-<pid>-<token>": a warehouse being built beside its path
_RECREATE_WAIT_S = 30.0  # how long to wait for another process recreating the same file
_LONG_PATH = 200  # longer paths are shortened in messages


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
    """Open the warehouse file for the duration of a ``with`` block.

    A writer creates the file if needed (built beside it, then moved into place), applies
    pending migrations and re-creates the views.  Reader or writer, a file that a creation
    cut short left behind (see :func:`unfinished`) is recreated first.  ``wait_s`` retries a
    lock held by another process for that many seconds before raising
    :class:`WarehouseLocked`.  A full disk raises ``WarehouseError("no space left on device:
    W; …")``; a path the system refuses (too long) raises ``InputError``.
    """
    path = Path(path)
    _prepare(path, read_only=read_only, wait_s=wait_s)
    con = _connect(path, read_only=read_only, wait_s=wait_s)
    if read_only:
        try:
            _check_schema_readable(con, path)
            stale = not views_current(con)
        except duckdb.Error as exc:
            con.close()
            raise WarehouseError(f"warehouse {path}: {_first_line(exc)}") from None
        except BaseException:
            con.close()
            raise
        if stale:  # written by another matrun version: bring its views up to date, then read
            con.close()
            _refresh_views(path, wait_s)
            con = _connect(path, read_only=True, wait_s=wait_s)
    try:
        try:
            if not read_only:
                apply_migrations(con, path)
                create_views(con, path)
        except duckdb.Error as exc:
            raise database_error(path, exc) from None
        yield Warehouse(path=path, con=con, read_only=read_only)
    finally:
        con.close()


def _prepare(path: Path, *, read_only: bool, wait_s: float) -> None:
    """Make sure ``path`` is a warehouse DuckDB can open: recreate one a creation cut short;
    for a writer, create a missing one (and its parent directories)."""
    try:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(path)
        if unfinished(path):
            _recreate(path, wait_s)
        elif _stat(path) is None:
            if read_only:
                raise WarehouseError(f"warehouse {path} does not exist; run `matrun sweep` or "
                                     "`matrun ingest` first to create it")
            _create(path)
    except OSError as exc:
        raise os_error(path, exc) from None
    except duckdb.Error as exc:
        raise database_error(path, exc) from None


# -- errors ------------------------------------------------------------------------------


def shown(path: Path | str) -> str:
    """``path`` for a message: as it is, or cut to its start and length when very long."""
    text = str(path)
    return text if len(text) <= _LONG_PATH else f"{text[:60]}… ({len(text)} characters)"


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (an ``OSError`` or a DuckDB error) says the disk is full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc)


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


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if DuckDB has not already (a failed COMMIT has)."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


# -- creating and recreating the file ----------------------------------------------------


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def unfinished(path: Path) -> bool:
    """Whether ``path`` is what a warehouse creation cut short leaves behind, and nothing
    else: a regular file of 0 bytes, or shorter than DuckDB's header and starting with it,
    with no write-ahead log holding anything beside it.  Such a file never held a committed
    transaction (DuckDB cannot even open it), so recreating it loses nothing."""
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


def _recreate(path: Path, wait_s: float) -> None:
    """Replace an unfinished file with a new warehouse.  The replacer holds a lock on the
    old file and checks that the path still names it, so two processes never both do it."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        if is_no_space(exc) or exc.errno == errno.ENAMETOOLONG:
            raise
        raise WarehouseError(f"warehouse {shown(path)} is empty (its creation was cut short) and "
                             f"cannot be recreated here: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + max(wait_s, _RECREATE_WAIT_S)
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN) or time.monotonic() > deadline:
                    raise
                time.sleep(_RETRY_S)
        mine, now = os.fstat(fd), _stat(path)
        if now is None or (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino) or not unfinished(path):
            return  # another process recreated it meanwhile
        try:
            _wal(path).unlink()  # empty (unfinished() checked): nothing in it
        except FileNotFoundError:
            pass
        _create(path, replace=True)
    finally:
        os.close(fd)


def _create(path: Path, *, replace: bool = False) -> None:
    """Build a new, empty warehouse beside ``path`` (migrations, views, a checkpoint) and
    move it into place: a hard link, which never replaces a warehouse another process made
    meanwhile (theirs is kept), or with ``replace`` a rename over the unfinished file."""
    scratch = path.with_name(_SCRATCH.format(name=path.name)
                             + f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        con = duckdb.connect(str(scratch))
        try:
            apply_migrations(con, path)
            create_views(con, path)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        if _stat(_wal(scratch)) is not None:  # the checkpoint on close did not finish
            raise WarehouseError(f"could not create warehouse {shown(path)}: DuckDB left a "
                                 "write-ahead log it could not check in")
        _fsync(scratch)
        if replace:
            os.replace(scratch, path)
        else:
            _link_into_place(scratch, path)
        _fsync(path.parent)
    finally:
        _remove_scratch(scratch)


def _link_into_place(scratch: Path, path: Path) -> None:
    try:
        os.link(scratch, path)
    except FileExistsError:
        pass  # another process created it first: theirs is the warehouse
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            raise
        if _stat(path) is None:  # a file system without hard links
            os.rename(scratch, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the data is DuckDB-synced already
    finally:
        os.close(fd)


def _remove_scratch(scratch: Path) -> None:
    for leftover in (scratch, _wal(scratch)):
        try:
            leftover.unlink()
        except FileNotFoundError:
            pass
    shutil.rmtree(scratch.with_name(scratch.name + ".tmp"), ignore_errors=True)


def _remove_abandoned(path: Path) -> None:
    """Remove what a creation killed on this host left beside ``path`` (its process is gone)."""
    prefix = str(path.with_name(_SCRATCH.format(name=path.name) + f"{socket.gethostname()}-"))
    for name in glob.glob(glob.escape(prefix) + "*"):
        pid = name[len(prefix):].split("-")[0]
        if pid.isdigit() and not name.endswith((".wal", ".tmp")) and not _alive(int(pid)):
            _remove_scratch(Path(name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refresh_views(path: Path, wait_s: float) -> None:
    """Re-create the views of a warehouse whose views are not this matrun's (a reader found
    them stale).  Only matrun's own views and macros change; the data is not touched."""
    try:
        con = _connect(path, read_only=False, wait_s=wait_s)
    except WarehouseLocked:
        raise WarehouseError(f"warehouse {path} has the views of another matrun version and is being "
                             "written now; run `matrun ingest` on it once the writer is done") from None
    except duckdb.Error as exc:  # e.g. a read-only file system
        if is_no_space(exc):
            raise no_space_error(path) from None
        raise WarehouseError(f"warehouse {path} has the views of another matrun version and cannot be "
                             f"updated here ({_first_line(exc)}); run `matrun ingest` on it where it "
                             "is writable") from None
    try:
        create_views(con, path)
    except duckdb.Error as exc:
        raise database_error(path, exc) from None
    finally:
        con.close()


def _connect(path: Path, *, read_only: bool, wait_s: float) -> duckdb.DuckDBPyConnection:
    config = {"enable_external_access": False, "lock_configuration": True} if read_only else {}
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.IOException as exc:
            message = str(exc)
            if "Could not set lock on file" in message:
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    time.sleep(min(_RETRY_S, remaining))
                    continue
                raise WarehouseLocked(_locked_message(path, message)) from None
            if is_no_space(exc):
                raise no_space_error(path) from None
            if "not a valid DuckDB database file" in message:
                raise WarehouseError(f"{path} is not a DuckDB database file; point --warehouse "
                                     "at a matrun warehouse or at a new file name") from None
            raise WarehouseError(f"could not open warehouse {path}: {_first_line(exc)}") from None
        except duckdb.Error as exc:
            raise WarehouseError(f"could not open warehouse {path}: {_first_line(exc)}") from None


def _locked_message(path: Path, duckdb_message: str) -> str:
    match = _LOCK_PID.search(duckdb_message)
    holder = f" (pid {match.group(1)})" if match else ""
    return (f"warehouse {path} is in use by another matrun process{holder}; "
            "wait for it to finish or use a different --warehouse")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
            version     INTEGER PRIMARY KEY,
            name        VARCHAR NOT NULL,
            applied_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
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
    return done


def _applied_versions(con: duckdb.DuckDBPyConnection) -> set[int]:
    return {row[0] for row in con.execute("SELECT version FROM schema_migrations").fetchall()}


def _refuse_newer(path: Path, applied: set[int], known: list[Migration]) -> None:
    newest = known[-1].version if known else 0
    if applied and max(applied) > newest:
        raise WarehouseError(f"warehouse {path} has schema version {max(applied)}; this matrun "
                             f"knows up to {newest}: upgrade matrun")


def _check_schema_readable(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    tables = {row[0] for row in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
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


def view_sql() -> dict[str, str]:
    """``{view name: SELECT …}`` for every ``views/<name>.sql``, sorted by name."""
    views = {}
    for entry in resources.files("matrun.warehouse").joinpath("views").iterdir():
        match = _VIEW_FILE.match(entry.name)
        if match:
            body = entry.read_text(encoding="utf-8").strip()
            views[match.group(1)] = body[:-1].rstrip() if body.endswith(";") else body
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
    """The views and macros matrun created in this file (marked by their comment)."""
    views = [name for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' "
        "AND database_name = current_database() AND starts_with(comment, ?)",
        [VIEW_COMMENT_PREFIX]).fetchall()]
    macros = con.execute(
        "SELECT DISTINCT function_name, function_type FROM duckdb_functions() "
        "WHERE schema_name = 'main' AND database_name = current_database() "
        "AND function_type IN ('macro', 'table_macro') AND starts_with(comment, ?)",
        [MACRO_COMMENT_PREFIX]).fetchall()
    return views, macros


def _current(con, views, macros, old, old_macros, digest) -> bool:
    return (set(old) == set(views)
            and {name for name, _ in old_macros} == {name for name, _, _ in macros} | {DIGEST_MACRO}
            and con.execute(f"SELECT {DIGEST_MACRO}()").fetchall() == [(digest,)])


def views_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the file holds exactly this matrun's views and macros."""
    views, macros = view_sql(), macro_sql()
    old, old_macros = _owned(con)
    return _current(con, views, macros, old, old_macros, _views_digest(views, macros))


def create_views(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Drop the views and macros matrun made before and create the current ones (macros
    first, then views in dependency order), in one transaction.  Nothing is done when the
    warehouse already has exactly the current ones (same SQL digest, every view and macro
    present with matrun's comment)."""
    views = view_sql()
    order = _dependency_order(views)
    macros = macro_sql()
    digest = _views_digest(views, macros)
    con.execute("BEGIN TRANSACTION")
    try:
        old, old_macros = _owned(con)
        if _current(con, views, macros, old, old_macros, digest):
            con.execute("COMMIT")
            return
        for name in old:
            con.execute(f'DROP VIEW IF EXISTS "{name}"')
        for name, kind in old_macros:
            con.execute(f'DROP MACRO {"TABLE " if kind == "table_macro" else ""}IF EXISTS "{name}"')
        statements = [*macros, (DIGEST_MACRO, False, f"CREATE OR REPLACE MACRO {DIGEST_MACRO}() AS '{digest}'")]
        rendered = {name for name, _ in framework_sql.framework_macros()}
        for name, is_table, sql in statements:
            source = framework_sql.SOURCE if name in rendered else f"views/{MACRO_FILE}"
            try:
                con.execute(sql)
            except duckdb.Error as exc:
                raise WarehouseError(f"warehouse {path}: macro {name} ({source}) failed: "
                                     f"{_first_line(exc)}") from None
            con.execute(f"COMMENT ON MACRO {'TABLE ' if is_table else ''}\"{name}\" IS "
                        f"'{MACRO_COMMENT_PREFIX}{source}'")
        for name in order:
            try:
                con.execute(f'CREATE OR REPLACE VIEW "{name}" AS\n{views[name]}\n')
            except duckdb.Error as exc:
                raise WarehouseError(f"warehouse {path}: view {name} (views/{name}.sql) failed: "
                                     f"{_first_line(exc)}") from None
            con.execute(f"COMMENT ON VIEW \"{name}\" IS '{VIEW_COMMENT_PREFIX}views/{name}.sql'")
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def _dependency_order(views: dict[str, str]) -> list[str]:
    """Views that read other views come after them (a view may build on another)."""
    deps = {name: {other for other in views
                   if other != name and re.search(rf"\b{other}\b", sql)}
            for name, sql in views.items()}
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
