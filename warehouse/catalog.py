"""Where a warehouse's catalog and data live, and how any DuckDB client attaches it.

A warehouse directory holds either its own catalog — ``catalog.sqlite``, DuckLake's catalog
in SQLite's write-ahead-log mode (readers never wait for a writer), with the Parquet files
under ``data/`` — or a ``warehouse.toml`` naming a shared one::

    [catalog]
    postgres = "dbname=matrun host=db.example.org user=matrun"   # a libpq connection string
    data = "/shared/matrun-lake/"                                 # where every host sees the files

so that sweeps from several hosts or Slurm clusters write one warehouse (docs/WAREHOUSE.md
"Several hosts").  The DuckLake, SQLite and PostgreSQL extensions are loaded from the files
their PyPI packages install (``duckdb-extension-*``, the same release as DuckDB): nothing is
downloaded.  ``attach.sql`` in the directory holds the statements that open the warehouse
read-only in any DuckDB client of that release, wherever the directory is (moved, copied, on
another host): the extensions are loaded by name from the client's own install, and a local
catalog and its data are named relative to the directory, which the client runs in
(``cd W && duckdb -init attach.sql``).  Nothing in a local warehouse names the place it is in.

A shared catalog is made by :func:`create_shared` (``matrun warehouse init``), which checks
the connection string, the data directory and the server before writing anything.  Its
writers take no file lock (they run on other hosts): every ingest transaction also updates
the one-row table ``matrun.writer_epoch`` (:func:`claim_writer`), so DuckLake refuses to
commit the second of two that overlap, and the loser does its work again
(:func:`retry_conflicts`), seeing what the winner wrote.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import re
import secrets
import shutil
import socket
import sqlite3
import stat
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import parse_qsl, urlsplit

import duckdb

from matrun.errors import InputError, WarehouseError
from matrun.tomltext import TomlError, loads as toml_loads

CATALOG = "catalog.sqlite"
DATA = "data"
CONFIG = "warehouse.toml"
ATTACH_SQL = "attach.sql"
WRITER_LOCK = ".writer.lock"
#: Written into a lake built from a single-file warehouse once its rows are in.
UPGRADED = ".upgraded-from"
#: The first 16 bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
_EXTENSIONS = {"ducklake": "duckdb_extension_ducklake", "sqlite_scanner": "duckdb_extension_sqlite_scanner",
               "postgres_scanner": "duckdb_extension_postgres_scanner"}


@dataclass(frozen=True)
class Layout:
    """A warehouse directory: its catalog (``sqlite:<file>`` or ``postgres:<conninfo>``),
    its data directory, and whether the catalog is local (a file in the directory)."""

    path: Path
    catalog: str
    data: Path
    local: bool


def layout(path: Path) -> Layout:
    """The layout of the warehouse directory ``path`` (its ``warehouse.toml``, if any)."""
    path = Path(os.path.abspath(path))
    config = path / CONFIG
    if not config.is_file():
        return Layout(path, f"sqlite:{path / CATALOG}", path / DATA, local=True)
    try:
        doc = toml_loads(config.read_text(encoding="utf-8"))
    except TomlError as exc:
        raise InputError(f"{config}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{config}: cannot be read: {exc}") from None
    section = doc.get("catalog")
    if not isinstance(section, dict) or set(section) - {"postgres", "data"}:
        raise InputError(f"{config}: [catalog] must hold exactly the keys postgres and data")
    conninfo, data = section.get("postgres"), section.get("data")
    for key, value in (("postgres", conninfo), ("data", data)):
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise InputError(f"{config}: [catalog] -> {key}: must be a non-empty string")
    if not os.path.isabs(data):
        raise InputError(f"{config}: [catalog] -> data: must be an absolute path every host sees")
    return Layout(path, f"postgres:{conninfo}", Path(data), local=False)


def is_warehouse(path: Path) -> bool:
    """Whether the directory ``path`` is a warehouse (:func:`warehouse_problem` finds nothing)."""
    return warehouse_problem(path) is None


def warehouse_problem(path: Path) -> str | None:
    """Why the directory ``path`` is not a warehouse, or None when it is one: it has a
    ``warehouse.toml``, or a ``catalog.sqlite`` that is a DuckLake catalog.  Files are only
    read, never opened for writing, and nothing is created beside them."""
    if (path / CONFIG).is_file():
        return None
    file = path / CATALOG
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return f"it has no {CATALOG} or {CONFIG}"
    except OSError as exc:
        return f"its {CATALOG} cannot be read: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"its {CATALOG} is not a file"
    try:
        with open(file, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        return f"its {CATALOG} cannot be read: {exc.strerror or exc}"
    if head != SQLITE_MAGIC:
        return f"its {CATALOG} is not a SQLite database"
    if not _holds_ducklake(file):
        return f"its {CATALOG} is a SQLite database but not a DuckLake catalog"
    return None


def _holds_ducklake(file: Path) -> bool:
    """Whether the SQLite database ``file`` holds DuckLake's ``ducklake_metadata`` table, read
    as an immutable file (no lock, no ``-wal`` or ``-shm`` file made); when that misses it and a
    write-ahead log with data lies beside it (a catalog never checkpointed), read again through
    the log, read-only."""
    uri = "file:" + urllib.request.pathname2url(str(file))
    for mode in ("mode=ro&immutable=1", "mode=ro"):
        if mode == "mode=ro" and not _has_log(file):
            return False
        try:
            con = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=5)
            try:
                found = con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                                    "AND name = 'ducklake_metadata'").fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            found = 0
        if found:
            return True
    return False


def _has_log(file: Path) -> bool:
    try:
        return os.stat(f"{file}-wal").st_size > 0
    except OSError:
        return False


#: The configuration of every DuckDB instance matrun opens a lake in.  matrun loads exactly two
#: extensions, by absolute path, from the packages pip installed beside the ``duckdb`` module
#: that loads them (:func:`extension_path`): a file as trusted as that module's own binary, whose
#: hashes pip checked against the wheel's RECORD.  DuckDB's signature check of such a file
#: (SHA-256 over its 35-40 MB, then RSA) took 0.2-0.35 s of every instance on this 2-core host,
#: and every matrun command makes one or two: it is skipped.  Nothing else can be loaded behind
#: matrun's back: DuckDB neither installs nor autoloads a known extension from the user's
#: ``~/.duckdb`` in these instances, and a reader's user SQL can load nothing (LOAD and INSTALL
#: are refused before it runs, external access is off and the configuration locked:
#: ``warehouse.db.reader_statements``).  docs/WAREHOUSE.md "Extensions".
LAKE_CONFIG = {"allow_unsigned_extensions": True, "autoload_known_extensions": False,
               "autoinstall_known_extensions": False}


def lake_connect() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB instance configured for matrun's own extensions (``LAKE_CONFIG``),
    its progress bar off: DuckDB prints the bar to the process's stdout once a query passes 2 s,
    into piped output and a library caller's too (on a loaded host a ``count(*)`` printed by a
    script read ``100% ▕███▏ … 0``)."""
    con = duckdb.connect(config=LAKE_CONFIG)
    con.execute("SET enable_progress_bar = false")
    return con


@functools.lru_cache(maxsize=None)
def extension_path(name: str) -> Path:
    """The ``.duckdb_extension`` file of extension ``name`` for this DuckDB release."""
    package = _EXTENSIONS[name]
    spec = importlib.util.find_spec(package)
    where = Path(spec.origin).parent if spec and spec.origin else None
    found = where / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension" if where else None
    if found is None or not found.is_file():
        raise WarehouseError(f"the DuckDB extension {name} for DuckDB {duckdb.__version__} is not "
                             f"installed: pip install {package.replace('_', '-')}=={duckdb.__version__}")
    return found


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def attach_statements(lay: Layout, *, read_only: bool, snapshot: int | None = None) -> list[str]:
    """The statements that load the extensions (from matrun's install) and attach the lake as
    ``lake``, in use, with this location's absolute paths; ``snapshot`` pins a read-only
    attach to that snapshot."""
    scanner = "sqlite_scanner" if lay.local else "postgres_scanner"
    options = [f"DATA_PATH {_quote(str(lay.data) + os.sep)}", "OVERRIDE_DATA_PATH true"]
    if read_only:
        options.insert(0, "READ_ONLY")
    if snapshot is not None:
        options.append(f"SNAPSHOT_VERSION {int(snapshot)}")
    return [f"LOAD {_quote(str(extension_path('ducklake')))}",
            f"LOAD {_quote(str(extension_path(scanner)))}",
            f"ATTACH {_quote('ducklake:' + lay.catalog)} AS lake ({', '.join(options)})",
            "USE lake"]


def portable_statements(lay: Layout) -> list[str]:
    """``attach.sql``'s statements: the extensions loaded by name (the client's own install),
    the lake attached read-only as ``lake``; a local catalog and its data named relative to
    the warehouse directory (the client's working directory), a shared catalog as
    ``warehouse.toml`` names it."""
    if lay.local:
        source, data = f"sqlite:{CATALOG}", f"{DATA}/"
    else:
        source, data = lay.catalog, str(lay.data).rstrip(os.sep) + os.sep
    return ["LOAD ducklake", f"LOAD {'sqlite' if lay.local else 'postgres'}",
            f"ATTACH {_quote('ducklake:' + source)} AS lake (READ_ONLY, DATA_PATH {_quote(data)}, "
            "OVERRIDE_DATA_PATH true)",
            "USE lake"]


def attach_sql(lay: Layout) -> str:
    """``attach.sql``: what a plain DuckDB client runs to read the warehouse.  A local
    warehouse's names no absolute path, so it is the same text wherever the directory is."""
    where = ("-- Run it in the warehouse directory (its paths are relative to the working directory):\n"
             f"--   cd <this directory> && duckdb -init {ATTACH_SQL}\n"
             f"--   Python: os.chdir(<this directory>); duckdb.connect().execute(open('{ATTACH_SQL}').read())"
             if lay.local else
             f"-- Run it from any directory: duckdb -init <this directory>/{ATTACH_SQL}")
    lines = [f"-- Opens this matrun warehouse read-only in DuckDB {duckdb.__version__} (its tables and views",
             "-- in the database `lake`), with no matrun installed.",
             where,
             "-- LOAD finds the extensions by name in the client's extension directory",
             f"-- (~/.duckdb/extensions/v{duckdb.__version__}/<platform>/): INSTALL them once, or copy them",
             "-- there from the pip packages duckdb-extension-ducklake, -sqlite-scanner, -postgres-scanner.",
             "-- `matrun shell` opens it from anywhere.",
             *(f"{statement};" for statement in portable_statements(lay))]
    return "\n".join(lines) + "\n"


def write_attach_sql(lay: Layout) -> None:
    """Write ``attach.sql`` when it differs from what is there (an older matrun's, which named
    absolute paths); replaced atomically."""
    text = attach_sql(lay)
    out = lay.path / ATTACH_SQL
    try:
        if out.read_text(encoding="utf-8") == text:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    tmp = out.with_name(f".{ATTACH_SQL}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)


def stale_attach_sql(lay: Layout) -> bool:
    """Whether ``attach.sql`` is not what this matrun writes for the warehouse (an older
    matrun's names the absolute paths of the place it was written in); the next writer
    rewrites it, a reader leaves it."""
    try:
        return (lay.path / ATTACH_SQL).read_text(encoding="utf-8") != attach_sql(lay)
    except (OSError, UnicodeDecodeError):
        return True


#: The database DuckLake attaches a lake's catalog as (``__ducklake_metadata_<name>``).
METADATA = "__ducklake_metadata_lake"
_LIVE = "begin_snapshot <= $s AND (end_snapshot IS NULL OR end_snapshot > $s)"


def newest_snapshot(con: duckdb.DuckDBPyConnection) -> int:
    """The id of the newest snapshot in the catalog of the lake ``con`` has attached as
    ``lake`` (read from the catalog itself: a lake attached at an older snapshot sees it)."""
    return con.execute(f"SELECT max(snapshot_id) FROM {METADATA}.ducklake_snapshot").fetchone()[0]


def snapshot_files(con: duckdb.DuckDBPyConnection, lay: Layout, snapshot: int) -> list[str]:
    """The absolute path of every file a reader of ``snapshot`` may read: the data and delete
    files of every table then, resolved as DuckLake does (a relative path under its table's,
    a relative table path under its schema's, a relative schema path under the data path)."""
    rows = con.execute(f"""
        WITH s AS (SELECT schema_id, path, path_is_relative FROM {METADATA}.ducklake_schema WHERE {_LIVE}),
             t AS (SELECT table_id, schema_id, path, path_is_relative FROM {METADATA}.ducklake_table WHERE {_LIVE}),
             f AS (SELECT table_id, path, path_is_relative FROM {METADATA}.ducklake_data_file WHERE {_LIVE}
                   UNION ALL
                   SELECT table_id, path, path_is_relative FROM {METADATA}.ducklake_delete_file WHERE {_LIVE})
        SELECT DISTINCT s.path, s.path_is_relative, t.path, t.path_is_relative, f.path, f.path_is_relative
        FROM f JOIN t USING (table_id) JOIN s USING (schema_id)""", {"s": snapshot}).fetchall()
    data = str(lay.data).rstrip(os.sep) + os.sep
    files = []
    for schema, schema_rel, table, table_rel, file, file_rel in rows:
        where = file
        if file_rel is not False:
            base = table
            if table_rel is not False:
                base = (data + (schema or "") if schema_rel is not False else schema) + (table or "")
            where = base + file
        files.append(os.path.normpath(where))
    return sorted(set(files))


def create_local(lay: Layout) -> None:
    """Create an empty SQLite catalog in write-ahead-log mode (DuckLake fills it on the first
    attach), and the data directory."""
    lay.data.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(lay.path / CATALOG)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def checkpoint_local(lay: Layout) -> None:
    """Fold a local catalog's write-ahead log into it (before the directory is copied)."""
    con = sqlite3.connect(lay.path / CATALOG)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


# -- a shared catalog: creating one ------------------------------------------------------

#: The keys of a libpq connection string that hold a secret: refused in ``warehouse.toml``
#: (every host reads it, and ``attach.sql`` repeats it); libpq reads ``~/.pgpass`` instead.
_SECRET_KEYS = {"password"}
_URI_SCHEMES = ("postgresql://", "postgres://")
#: Seconds a check of the server waits for it when the connection string sets no timeout.
PROBE_TIMEOUT_S = 10
_PROBE = "matrun_catalog_probe"
#: libpq's messages about the connection string itself (bad input), not about the server.
_BAD_CONNINFO = ("invalid connection option", "missing \"=\" after", "unterminated quoted string",
                 "invalid URI", "invalid percent-encoded token", "invalid integer value",
                 "invalid port number", "invalid sslmode value", "invalid value for parameter",
                 "invalid target_session_attrs value", "invalid channel_binding value",
                 "invalid gssencmode value", "end of string reached when looking for matching")


def conninfo_pairs(conninfo: str) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of a libpq connection string, keyword form
    (``host=db port=5432 dbname='my lake'``) or URI (``postgresql://user@db/lake?…``);
    ``InputError`` for one that is empty or does not parse."""
    text = conninfo.strip()
    if not text or any(ord(ch) < 32 and ch not in " \t" for ch in text) or "\x7f" in text:
        raise InputError("--postgres: give a libpq connection string, e.g. \"host=db.example.org "
                         "dbname=matrun user=matrun\" (no control characters)")
    if text.startswith(_URI_SCHEMES):
        return _uri_pairs(text)
    return _keyword_pairs(text)


def _keyword_pairs(text: str) -> list[tuple[str, str]]:
    """libpq's ``conninfo_parse``: ``key = value`` pairs, a value bare (up to whitespace) or
    single-quoted, a backslash escaping the next character in either."""
    pairs, i, n = [], 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            break
        start = i
        while i < n and not text[i].isspace() and text[i] != "=":
            i += 1
        key = text[start:i]
        while i < n and text[i].isspace():
            i += 1
        if i == n or text[i] != "=" or not key:
            raise InputError(f"--postgres: missing \"=\" after \"{key}\" in the connection string "
                             "(the form is key=value key='a value')")
        i += 1
        while i < n and text[i].isspace():
            i += 1
        value: list[str] = []
        quoted = i < n and text[i] == "'"
        i += quoted
        while i < n and (quoted or not text[i].isspace()):
            if text[i] == "\\" and i + 1 < n:
                i += 1
            elif quoted and text[i] == "'":
                break
            value.append(text[i])
            i += 1
        if quoted:
            if i == n:
                raise InputError(f"--postgres: the quoted value of \"{key}\" is not terminated")
            i += 1
        pairs.append((key, "".join(value)))
    return pairs


def _uri_pairs(text: str) -> list[tuple[str, str]]:
    try:
        parts = urlsplit(text)
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        port = parts.port
    except ValueError as exc:
        raise InputError(f"--postgres: not a valid PostgreSQL URI: {exc}") from None
    pairs = [(key, value) for key, value in (
        ("user", parts.username), ("password", parts.password), ("host", parts.hostname),
        ("port", None if port is None else str(port)), ("dbname", parts.path.lstrip("/") or None)) if value]
    return pairs + query


def check_conninfo(conninfo: str) -> None:
    """Refuse a connection string that does not parse or that holds a password."""
    if {key for key, _ in conninfo_pairs(conninfo)} & _SECRET_KEYS:
        raise InputError("--postgres: the connection string holds a password; every host reads "
                         f"it from {CONFIG} and {ATTACH_SQL}: put the password in ~/.pgpass (or the "
                         "file PGPASSFILE names) on each host instead, or use another authentication "
                         "method")


def shown_conninfo(conninfo: str) -> str:
    """The connection string for a message, any password replaced by ``***``."""
    try:
        pairs = conninfo_pairs(conninfo)
    except InputError:
        return "(a connection string that does not parse)"
    text = conninfo.strip()
    if text.startswith(_URI_SCHEMES):
        parts = urlsplit(text)
        if parts.password:
            text = text.replace(f":{parts.password}@", ":***@", 1)
        return re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", text)
    return " ".join(f"{key}={'***' if key in _SECRET_KEYS else _conninfo_value(value)}"
                    for key, value in pairs)


def _conninfo_value(value: str) -> str:
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_data_dir(data: Path | str) -> Path:
    """The absolute data directory ``data``, created when missing and checked writable
    (a file written and removed); ``InputError`` naming it otherwise."""
    text = str(data)
    if not os.path.isabs(text):
        raise InputError(f"--data {text}: must be an absolute path, the same directory every host "
                         "sees (a shared file system: NFS, Lustre, …)")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text) or not _utf8(text):
        raise InputError(f"--data {text!r}: a directory name with control characters or bytes that "
                         "are not UTF-8 cannot be written into the configuration")
    path = Path(os.path.normpath(text))
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".matrun-write-check-{socket.gethostname()}-{os.getpid()}"
        probe.write_bytes(b"ok\n")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"--data {path}: cannot be written here: {exc.strerror or exc}") from None
    return path


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def probe_postgres(conninfo: str) -> bool:
    """Connect to the PostgreSQL database ``conninfo`` names; True when it already holds a
    DuckLake.  ``InputError`` when libpq refuses the connection string or the database holds
    tables of something else; ``WarehouseError`` when the server cannot be reached or refuses
    the connection."""
    con = lake_connect()
    try:
        con.execute(f"LOAD {_quote(str(extension_path('postgres_scanner')))}")
        try:
            con.execute(f"ATTACH {_quote(_with_timeout(conninfo))} AS {_PROBE} (TYPE postgres, READ_ONLY)")
            tables = [name for (name,) in con.execute(
                f"SELECT * FROM postgres_query('{_PROBE}', 'SELECT table_schema || ''.'' || table_name "
                "FROM information_schema.tables WHERE table_schema NOT IN (''pg_catalog'', "
                "''information_schema'') ORDER BY 1')").fetchall()]
        except duckdb.Error as exc:
            raise _connection_error(conninfo, exc) from None
    finally:
        con.close()
    foreign = [name for name in tables if not name.split(".", 1)[1].startswith("ducklake_")]
    if foreign:
        raise InputError(f"--postgres {shown_conninfo(conninfo)}: the database holds other tables "
                         f"({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''}); give the "
                         "warehouse a database of its own (createdb)")
    return bool(tables)


def _with_timeout(conninfo: str) -> str:
    """``conninfo`` with libpq's ``connect_timeout`` set, unless it sets one."""
    if any(key == "connect_timeout" for key, _ in conninfo_pairs(conninfo)):
        return conninfo
    if conninfo.strip().startswith(_URI_SCHEMES):
        return f"{conninfo}{'&' if '?' in conninfo else '?'}connect_timeout={PROBE_TIMEOUT_S}"
    return f"{conninfo} connect_timeout={PROBE_TIMEOUT_S}"


def _connection_error(conninfo: str, exc: duckdb.Error) -> InputError | WarehouseError:
    """The postgres extension's error as a matrun error, without the connection string it
    repeats (it may hold a password)."""
    text = str(exc).strip()
    text = re.sub(r'^IO Error: Unable to connect to Postgres at ".*?": ', "", text, count=1, flags=re.S)
    detail = " ".join(line.strip() for line in text.splitlines() if line.strip())[:400]
    if any(marker in detail for marker in _BAD_CONNINFO):
        return InputError(f"--postgres {shown_conninfo(conninfo)}: {detail}")
    return WarehouseError(f"cannot reach the PostgreSQL catalog {shown_conninfo(conninfo)}: {detail} "
                          "(check that the server runs and that `psql` connects with this string)")


def config_text(conninfo: str, data: Path) -> str:
    """``warehouse.toml`` naming the catalog ``conninfo`` and the data directory ``data``."""
    text = (f"# A matrun warehouse whose catalog several hosts share (docs/WAREHOUSE.md \"Several hosts\").\n"
            f"# Every host's --warehouse is a directory holding this file; `data` may differ between\n"
            f"# hosts that mount the shared directory elsewhere.\n"
            f"[catalog]\n"
            f"postgres = {json.dumps(conninfo, ensure_ascii=False)}\n"
            f"data = {json.dumps(str(data) + os.sep, ensure_ascii=False)}\n")
    toml_loads(text)  # what layout() reads back
    return text


def create_shared(path: Path | str, *, postgres: str, data: Path | str) -> tuple[Layout, bool]:
    """Make ``path`` (absent, or an empty directory) a warehouse whose catalog is the
    PostgreSQL database ``postgres`` and whose Parquet files go under ``data``: the inputs
    checked, the server reached, the lake created in it (or found there: another host made
    it), ``warehouse.toml`` and ``attach.sql`` written in a directory built beside ``path``
    and renamed into place.  Returns the layout and whether the lake was there already.
    The tables come with the first writer's open (migrations)."""
    path = Path(os.path.abspath(path))
    _check_new(path)
    check_conninfo(postgres)
    data = check_data_dir(data)
    existed = probe_postgres(postgres)
    scratch = path.with_name(f".{path.name}.creating-{socket.gethostname()}-{os.getpid()}-"
                             f"{secrets.token_hex(4)}")
    try:
        scratch.mkdir(parents=True)
        (scratch / CONFIG).write_text(config_text(postgres, data), encoding="utf-8")
        lay = layout(scratch)
        con = lake_connect()
        try:
            for statement in attach_statements(lay, read_only=False):
                con.execute(statement)
            con.execute("BEGIN TRANSACTION")
            claim_writer(con)  # its table made now, not by the first two writers at once
            con.execute("COMMIT")
        except duckdb.Error as exc:
            raise WarehouseError(f"cannot create the lake in the PostgreSQL catalog "
                                 f"{shown_conninfo(postgres)}: {str(exc).strip().splitlines()[0]}") from None
        finally:
            con.close()
        write_attach_sql(lay)
        os.rename(scratch, path)  # onto an empty directory, or a new name
    except OSError as exc:
        raise WarehouseError(f"cannot create warehouse {path}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return layout(path), existed


def _check_new(path: Path) -> None:
    """``path`` is nothing yet, or an empty directory."""
    try:
        if not path.exists() and not path.is_symlink():
            return
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            return
    except OSError as exc:
        raise InputError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    raise InputError(f"{path}: already exists and is not an empty directory; give `matrun warehouse "
                     "init` a new path (each host's warehouse directory holds only its "
                     f"{CONFIG} and {ATTACH_SQL})")


# -- several writers of one catalog ------------------------------------------------------

#: The schema and one-row table that every ingest transaction into a shared catalog updates.
WRITERS_SCHEMA = "matrun"
WRITER_EPOCH = "writer_epoch"
#: Attempts of one piece of work that conflicted with other writers, and the pauses between
#: them (random within [p/2, p], p doubling from the first up to the longest).
CONFLICT_ATTEMPTS = 10
CONFLICT_PAUSE_S = (0.1, 8.0)
#: What DuckLake says when it refuses a commit that another transaction's changes conflict
#: with (after its own retries of the commit, ``ducklake_max_retry_count``).
_CONFLICT_TEXTS = ("Transaction conflict", "write-write conflict", "Exceeded the maximum retry count")

T = TypeVar("T")


class WriterConflict(Exception):
    """Another writer committed while this transaction ran: DuckLake refused the commit, or
    the rows about to be written are already there.  The transaction was rolled back."""


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckLake refusing a commit that conflicts with another one."""
    return isinstance(exc, duckdb.Error) and any(text in str(exc) for text in _CONFLICT_TEXTS)


def claim_writer(con: duckdb.DuckDBPyConnection) -> None:
    """In the open transaction: update the one row of ``matrun.writer_epoch`` (created when
    missing), so this transaction and any other one that claims while it runs cannot both
    commit."""
    table = f"lake.{WRITERS_SCHEMA}.{WRITER_EPOCH}"
    con.execute(f"CREATE SCHEMA IF NOT EXISTS lake.{WRITERS_SCHEMA}")
    con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT 0::BIGINT AS epoch, "
                "NULL::VARCHAR AS host, NULL::INTEGER AS pid, NULL::TIMESTAMP AS claimed_at")
    con.execute(f"UPDATE {table} SET epoch = epoch + 1, host = ?, pid = ?, claimed_at = ?",
                [socket.gethostname(), os.getpid(), datetime.now(timezone.utc).replace(tzinfo=None)])


def retry_conflicts(path: Path, work: Callable[[], T], *, attempts: int = CONFLICT_ATTEMPTS,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """``work()``, done again after a pause while it raises :class:`WriterConflict`, at most
    ``attempts`` times; then ``WarehouseError``."""
    pause, longest = CONFLICT_PAUSE_S
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except WriterConflict as exc:
            last = str(exc)
            if attempt == attempts:
                break
            sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, longest)
    raise WarehouseError(f"warehouse {path}: {attempts} attempts to write conflicted with other "
                         f"writers of its catalog (the last: {last[:300]}); this batch was not "
                         "written: run the command again")


# -- what a warehouse holds --------------------------------------------------------------


@dataclass(frozen=True)
class LakeInfo:
    """What ``matrun warehouse info`` shows besides the layout."""

    schema_version: int
    runs: int
    snapshot: int
    data_files: dict[str, int]


def lake_info(con: duckdb.DuckDBPyConnection) -> LakeInfo:
    """The schema version, runs, current snapshot and data files per table of the lake
    ``con`` has attached as ``lake`` (one snapshot: a read-only connection's)."""
    version, runs = con.execute("SELECT (SELECT max(version) FROM lake.main.schema_migrations), "
                                "(SELECT count(*) FROM lake.main.runs)").fetchone()
    (snapshot,) = con.execute("SELECT id FROM ducklake_current_snapshot('lake')").fetchone()
    files = dict(con.execute("SELECT table_name, file_count FROM ducklake_table_info('lake') "
                             "ORDER BY table_name").fetchall())
    return LakeInfo(version or 0, runs, snapshot, files)
