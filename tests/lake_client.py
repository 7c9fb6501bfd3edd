"""A warehouse opened the way any DuckDB client opens it, without matrun's code.

``plain_connect(path)`` runs the warehouse's ``attach.sql`` in a bare DuckDB connection, as a
user's own script or the DuckDB CLI would; ``plain_writer(path)`` attaches it writable (what
a test does to fake an older warehouse's state).

``attach.sql`` loads the extensions by name, from the client's extension directory:
``client_extensions()`` is one, laid out as DuckDB's own (``v<version>/<platform>/``), holding
the files of the pip packages (what a user who ran ``INSTALL ducklake`` once has in
``~/.duckdb/extensions``); ``autoinstall_known_extensions`` is off, so nothing is downloaded.
A local warehouse's ``attach.sql`` names its catalog and data relative to the warehouse
directory, where a client runs it; one process cannot run in every test's warehouse at once,
so these helpers put the warehouse's own path in front of those two names, as ``cd`` does.
Reading it from the warehouse directory itself, with the DuckDB CLI and a bare Python, is
tested in ``test_warehouse_portable.py``.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import duckdb

from matrun.warehouse.catalog import extension_path

EXTENSIONS = ("ducklake", "sqlite_scanner", "postgres_scanner")


@functools.lru_cache(maxsize=1)
def client_extensions() -> Path:
    """A DuckDB extension directory holding the ducklake, sqlite and postgres extensions."""
    root = Path(tempfile.mkdtemp(prefix="duckdb-client-extensions-"))
    atexit.register(shutil.rmtree, root, True)
    platform = duckdb.connect().execute("PRAGMA platform").fetchone()[0]
    where = root / f"v{duckdb.__version__}" / platform
    where.mkdir(parents=True)
    for name in EXTENSIONS:
        os.symlink(extension_path(name), where / f"{name}.duckdb_extension")
    return root


@functools.lru_cache(maxsize=1)
def client_home() -> Path:
    """A home directory whose ``.duckdb/extensions`` is :func:`client_extensions`: a DuckDB
    client run with it as ``HOME`` finds the extensions by name, where DuckDB looks first."""
    home = Path(tempfile.mkdtemp(prefix="duckdb-client-home-"))
    atexit.register(shutil.rmtree, home, True)
    (home / ".duckdb").mkdir()
    os.symlink(client_extensions(), home / ".duckdb" / "extensions")
    return home


def client_env() -> dict[str, str]:
    """The environment of a plain client process: ``HOME`` is :func:`client_home`."""
    return {**os.environ, "HOME": str(client_home())}


def client(extensions: Path | None = None) -> duckdb.DuckDBPyConnection:
    """A bare DuckDB connection finding extensions in ``extensions`` (default
    :func:`client_extensions`), never downloading one."""
    con = duckdb.connect()
    home = str(extensions or client_extensions()).replace("'", "''")
    con.execute(f"SET autoinstall_known_extensions = false; SET extension_directory = '{home}'")
    return con


def attach_text(path: Path | str) -> str:
    """The warehouse's ``attach.sql``, its relative names taken from the warehouse directory."""
    where = str(Path(path).absolute()).replace("'", "''")
    text = (Path(path) / "attach.sql").read_text(encoding="utf-8")
    return (text.replace("'ducklake:sqlite:catalog.sqlite'", f"'ducklake:sqlite:{where}/catalog.sqlite'")
                .replace("DATA_PATH 'data/'", f"DATA_PATH '{where}/data/'"))


def plain_connect(path: Path | str) -> duckdb.DuckDBPyConnection:
    """A bare DuckDB connection reading the warehouse at ``path`` through its ``attach.sql``."""
    con = client()
    con.execute(attach_text(path))
    return con


def plain_writer(path: Path | str) -> duckdb.DuckDBPyConnection:
    """The same, attached writable (``attach.sql`` without its READ_ONLY)."""
    con = client()
    con.execute(attach_text(path).replace("(READ_ONLY, ", "("))
    return con
