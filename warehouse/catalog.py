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
read-only in any DuckDB client of that release (``duckdb -init W/attach.sql``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sqlite3
import tomllib
from dataclasses import dataclass
from pathlib import Path

import duckdb

from matrun.errors import InputError, WarehouseError

CATALOG = "catalog.sqlite"
DATA = "data"
CONFIG = "warehouse.toml"
ATTACH_SQL = "attach.sql"
WRITER_LOCK = ".writer.lock"
#: Written into a lake built from a single-file warehouse once its rows are in.
UPGRADED = ".upgraded-from"
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
        doc = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
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
    """Whether the directory ``path`` is a warehouse (it has a catalog or a ``warehouse.toml``)."""
    return (path / CATALOG).is_file() or (path / CONFIG).is_file()


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


def attach_statements(lay: Layout, *, read_only: bool) -> list[str]:
    """The statements that load the extensions and attach the lake as ``lake``, in use."""
    scanner = "sqlite_scanner" if lay.local else "postgres_scanner"
    options = [f"DATA_PATH {_quote(str(lay.data) + os.sep)}", "OVERRIDE_DATA_PATH true"]
    if read_only:
        options.insert(0, "READ_ONLY")
    return [f"LOAD {_quote(str(extension_path('ducklake')))}",
            f"LOAD {_quote(str(extension_path(scanner)))}",
            f"ATTACH {_quote('ducklake:' + lay.catalog)} AS lake ({', '.join(options)})",
            "USE lake"]


def attach_sql(lay: Layout) -> str:
    """``attach.sql``: what a plain DuckDB client runs to read the warehouse."""
    lines = [f"-- Open this matrun warehouse read-only in DuckDB {duckdb.__version__}:",
             f"--   duckdb -init {lay.path / ATTACH_SQL}",
             "-- or run these statements in any client (Python: con.execute(open(this file).read())).",
             "-- Rewritten by every matrun writer; the tables and views are in the database `lake`.",
             *(f"{statement};" for statement in attach_statements(lay, read_only=True))]
    return "\n".join(lines) + "\n"


def write_attach_sql(lay: Layout, *, final: Path | None = None) -> None:
    """Write ``attach.sql`` (as it will read once the directory is at ``final``) when it
    differs from what is there; replaced atomically."""
    target = lay if final is None else layout_at(lay, final)
    text = attach_sql(target)
    out = lay.path / ATTACH_SQL
    try:
        if out.read_text(encoding="utf-8") == text:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    tmp = out.with_name(f".{ATTACH_SQL}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)


def layout_at(lay: Layout, path: Path) -> Layout:
    """``lay`` as it will be once its directory is renamed to ``path``."""
    path = Path(os.path.abspath(path))
    if not lay.local:
        return Layout(path, lay.catalog, lay.data, local=False)
    return Layout(path, f"sqlite:{path / CATALOG}", path / DATA, local=True)


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
