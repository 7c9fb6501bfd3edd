"""Tables and views of the warehouse as Parquet or CSV files with a manifest, for pandas,
Polars, Spark and spreadsheets (``matrun export``; docs/WAREHOUSE.md "Export").

Every table and view of one export is read through one read-only connection inside one
transaction, so they all show the same state of the warehouse.  Rows stream: DuckDB hands
over Arrow record batches of ``batch_rows`` rows and each is written before the next is
read, so a table of any size is never held whole.

Time zone-aware timestamps are written in UTC (Parquet ``TIMESTAMP(isAdjustedToUTC)``, CSV
ISO 8601 text with ``+00:00``); JSON columns are text; lists are Parquet lists and JSON text
in CSV.  CSV cells are written exactly as ``matrun query --format csv`` writes them
(:func:`matrun.warehouse.query.write_csv`: a cell a spreadsheet would run as a formula gets
a leading apostrophe).

The files are written into a hidden directory beside ``out_dir`` and renamed into place
only when every file and ``manifest.json`` is complete and synced, so a failed export (a
full disk, a view that fails, Ctrl-C) leaves nothing at ``out_dir`` and an earlier export
there untouched.  An existing ``out_dir`` is replaced only when it is empty, or with
``force`` when it holds an earlier export and nothing else.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import matrun
from matrun.errors import InputError, MatrunError, WarehouseError
from matrun.warehouse import materialise
from matrun.warehouse.db import is_no_space, open_warehouse, rollback, shown, view_sql
from matrun.warehouse.query import write_csv

FORMATS = ("parquet", "csv")
MANIFEST = "manifest.json"
#: The version of manifest.json's layout; it changes when a key changes meaning or goes.
MANIFEST_VERSION = 1
#: Rows read from DuckDB and written at a time (one Parquet row group each): DuckDB's own
#: row group size.
BATCH_ROWS = 122_880
#: Names that are safe as file names everywhere; a table or view named otherwise (only a
#: user's own could be) is not offered.
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_HASH_CHUNK = 1 << 20
#: Errors about the export directory itself that are bad input (exit 2), not a failure.
_INPUT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.ENOTDIR,
                 errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ELOOP}

_TABLES_SQL = """
    SELECT table_name, 'table' FROM duckdb_tables()
    WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
    UNION ALL
    SELECT view_name, 'view' FROM duckdb_views()
    WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
"""


@dataclass(frozen=True)
class ExportedTable:
    """One file of an export, as the manifest describes it."""

    name: str
    file: str
    kind: str  # "table" or "view"
    rows: int
    columns: list[dict[str, str]]  # {"name", "duckdb_type", "arrow_type"} per column, in order
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Export:
    """A finished export: where it is, its manifest (as written) and its files."""

    out_dir: Path
    manifest: dict[str, Any]
    tables: list[ExportedTable]


def export_warehouse(out_dir: Path | str, *, warehouse: Path | str, tables: Sequence[str] | None = None,
                     fmt: str = "parquet", force: bool = False, batch_rows: int = BATCH_ROWS) -> Export:
    """Write ``tables`` (default: every base table and every matrun view) of ``warehouse``
    into ``out_dir`` as ``<name>.parquet`` or ``<name>.csv``, with ``manifest.json``.

    Bad input raises :class:`InputError` before anything is written: a format not in
    :data:`FORMATS`, a name the warehouse has no table or view of, an ``out_dir`` that is a
    file, not empty (without ``force``, or with it when it is not an earlier export), not
    writable or named too long.  A full disk raises ``MatrunError("no space left on device:
    …")``; a table or view DuckDB cannot read raises :class:`WarehouseError`.
    """
    if fmt not in FORMATS:
        raise InputError(f"export format {fmt!r}: expected {' or '.join(FORMATS)}")
    out = Path(os.path.realpath(out_dir))  # a link to a directory: export into its target
    check_out_dir(out, force=force)
    with open_warehouse(warehouse, read_only=True) as wh:
        try:
            wh.con.execute("BEGIN TRANSACTION")  # one snapshot for every table and view
            chosen = choose(exportable(wh.con), tables)
            done = _write_export(wh.con, chosen, out, Path(warehouse), fmt=fmt, force=force,
                                 batch_rows=batch_rows)
        except duckdb.Error as exc:
            raise WarehouseError(f"warehouse {shown(warehouse)}: {_first_line(exc)}") from None
        finally:
            rollback(wh.con)
    _fsync(out.parent)
    return done


def _write_export(con: duckdb.DuckDBPyConnection, chosen: dict[str, str], out: Path, warehouse: Path, *,
                  fmt: str, force: bool, batch_rows: int) -> Export:
    """Write ``chosen`` and the manifest into a scratch directory beside ``out``, then move
    it into place; on any failure remove the scratch directory and leave ``out`` as it was."""
    scratch = _make_scratch(out)
    try:
        written = [_export_one(con, name, kind, scratch, fmt, batch_rows) for name, kind in chosen.items()]
        manifest = _manifest(con, warehouse, fmt, written)
        _write_manifest(scratch / MANIFEST, manifest)
        _fsync(scratch)
        _swap_in(scratch, out, force=force)
    except OSError as exc:  # writing the files: a full disk, a directory gone
        shutil.rmtree(scratch, ignore_errors=True)
        raise out_dir_error(out, exc) from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Export(out_dir=out, manifest=manifest, tables=written)


# -- choosing what to export ---------------------------------------------------------------


def exportable(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """``{name: "table" | "view"}`` for every base table and view of the warehouse's main
    schema (a user's own views too), by SQL, so it reads any storage DuckDB attaches."""
    found = {name: kind for name, kind in con.execute(_TABLES_SQL).fetchall() if _SAFE_NAME.match(name)}
    return dict(sorted(found.items(), key=lambda item: (item[1] != "table", item[0])))


def choose(known: dict[str, str], names: Sequence[str] | None) -> dict[str, str]:
    """The tables and views to export: ``names`` (any case, each once, in the order given),
    or by default every base table and every matrun view (``views/<name>.sql``).  A name the
    warehouse lacks raises :class:`InputError` naming it and listing the known ones."""
    if not names:
        matrun_views = set(view_sql())
        return {name: kind for name, kind in known.items()
                if (kind == "table" and not materialise.is_cache(name)) or name in matrun_views}
    by_lower = {name.lower(): name for name in known}
    unknown = [name for name in names if name.lower() not in by_lower]
    if unknown:
        # the views' caches and live views can be named, but are no answer to list
        tables = ", ".join(name for name, kind in known.items() if kind == "table" and not materialise.is_cache(name))
        views = ", ".join(name for name, kind in known.items()
                          if kind == "view" and not materialise.is_live_view(name))
        raise InputError(f"--table {', '.join(unknown)}: no such table or view in the warehouse "
                         f"(tables: {tables or 'none'}; views: {views or 'none'})")
    chosen = [by_lower[name.lower()] for name in names]
    return {name: known[name] for name in dict.fromkeys(chosen)}


# -- the export directory ------------------------------------------------------------------


def check_out_dir(out: Path, *, force: bool) -> None:
    """Raise :class:`InputError` unless ``out`` is new, an empty directory, or (with
    ``force``) an earlier export holding nothing else: checked before the work and again
    at the swap."""
    try:
        st = os.stat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise out_dir_error(out, exc) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"export directory {shown(out)} exists and is not a directory; choose a "
                         "directory to export into")
    try:
        entries = sorted(os.listdir(out))
    except OSError as exc:
        raise out_dir_error(out, exc) from None
    if not entries:
        return
    if not force:
        raise InputError(f"export directory {shown(out)} exists and is not empty; choose a new or "
                         "empty directory, or add --force to replace an earlier export")
    strangers = _not_exported(out, entries)
    if strangers:
        more = f" and {len(strangers) - 3} more" if len(strangers) > 3 else ""
        raise InputError(f"export directory {shown(out)} holds files matrun export did not write "
                         f"({', '.join(strangers[:3])}{more}); --force replaces only an earlier "
                         "export: choose another directory")


def _not_exported(out: Path, entries: list[str]) -> list[str]:
    """The entries of ``out`` that are not its manifest or a file the manifest names
    (everything, when there is no readable manifest)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        files = {entry["file"] for entry in manifest["tables"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return entries
    return [name for name in entries if name != MANIFEST and name not in files]


def out_dir_error(out: Path, exc: OSError) -> MatrunError:
    """An ``OSError`` on the export directory as a matrun error naming it: bad input (exit 2)
    unless the disk is full or the system failed."""
    if is_no_space(exc):
        return MatrunError(f"no space left on device: {shown(out)}; nothing was exported (an earlier "
                           "export there is untouched): free some space and run the command again")
    if exc.errno == errno.ENAMETOOLONG:
        return InputError(f"export directory {shown(out)}: file name too long")
    if exc.errno == errno.ENOTDIR:
        return InputError(f"export directory {shown(out)}: a part of the path is a file, not a directory")
    reason = exc.strerror or str(exc)
    if exc.errno in _INPUT_ERRNOS:
        return InputError(f"export directory {shown(out)}: cannot write there: {reason}")
    return MatrunError(f"export directory {shown(out)}: {reason}")


def _make_scratch(out: Path) -> Path:
    """A new hidden directory beside ``out`` (parents created) to write the export into."""
    scratch = out.parent / f".{out.name[:64]}.export-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch.mkdir()
    except OSError as exc:
        raise out_dir_error(out, exc) from None
    return scratch


def _swap_in(scratch: Path, out: Path, *, force: bool) -> None:
    """Rename ``scratch`` to ``out``; with ``force``, an earlier export there is moved aside
    first and removed once the new one is in place."""
    try:
        os.rename(scratch, out)  # out is new or an empty directory
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise out_dir_error(out, exc) from None
    if not force:
        raise InputError(f"export directory {shown(out)} is not empty: something wrote into it "
                         "during the export; nothing was exported")
    check_out_dir(out, force=True)  # files written there during the export are not replaced
    old = out.parent / f".{out.name[:64]}.replaced-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.rename(out, old)
        try:
            os.rename(scratch, out)
        except BaseException:
            os.rename(old, out)
            raise
    except OSError as exc:
        raise out_dir_error(out, exc) from None
    shutil.rmtree(old, ignore_errors=True)


# -- writing one table ----------------------------------------------------------------------


def _export_one(con: duckdb.DuckDBPyConnection, name: str, kind: str, scratch: Path, fmt: str,
                batch_rows: int) -> ExportedTable:
    """Stream table or view ``name`` into ``scratch/<name>.<fmt>``; describe the file."""
    what = f"{kind} {name}"
    try:
        relation = con.sql(f'SELECT * FROM "{name}"')
        duckdb_types = [str(t) for t in relation.types]
        reader = relation.to_arrow_reader(batch_rows)
    except duckdb.Error as exc:
        raise _read_error(what, exc) from None
    schema = _portable_schema(reader.schema)
    batches = _batches(reader, schema, what)
    path = scratch / f"{name}.{fmt}"
    try:
        rows = _write_parquet(path, schema, batches) if fmt == "parquet" else _write_csv(path, schema, batches)
        digest, size = _sync_and_hash(path)
    except pa.ArrowNotImplementedError as exc:  # a column type the format lacks
        raise WarehouseError(f"{what} cannot be written as {fmt}: {_first_line(exc)}") from None
    columns = [{"name": field.name, "duckdb_type": db_type, "arrow_type": str(field.type)}
               for field, db_type in zip(schema, duckdb_types)]
    return ExportedTable(name=name, file=path.name, kind=kind, rows=rows, columns=columns,
                         sha256=digest, bytes=size)


def _portable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as the files hold it (:func:`_portable`); the values do not change."""
    return pa.schema([field.with_type(_portable(field.type)) for field in schema], metadata=schema.metadata)


def _portable(kind: pa.DataType) -> pa.DataType:
    """A time zone-aware timestamp in UTC (DuckDB gives the session's time zone: the instants
    are the same), a list's item named ``element`` (as Parquet names it; DuckDB says ``l``)."""
    if pa.types.is_timestamp(kind) and kind.tz:
        return pa.timestamp(kind.unit, "UTC")
    if pa.types.is_list(kind):
        item = kind.value_field
        return pa.list_(pa.field("element", _portable(item.type), item.nullable))
    return kind


def _batches(reader: pa.RecordBatchReader, schema: pa.Schema, what: str) -> Iterator[pa.RecordBatch]:
    """The reader's batches in ``schema``; a DuckDB error while reading raises
    :class:`WarehouseError` (pyarrow passes DuckDB's errors on as ``OSError``, which must
    not be taken for an error of the file being written, and is not caught as one)."""
    batches = iter(reader)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            raise _read_error(what, exc) from None
        yield batch.cast(schema)


def _read_error(what: str, exc: BaseException) -> WarehouseError:
    return WarehouseError(f"reading {what} failed: {_first_line(exc)}; nothing was exported")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _write_parquet(path: Path, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
    rows = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


def _write_csv(path: Path, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
    def rows() -> Iterator[tuple[Any, ...]]:
        for batch in batches:
            yield from zip(*(column.to_pylist() for column in batch.columns))

    with open(path, "w", encoding="utf-8", newline="") as fh:
        return write_csv(schema.names, rows(), fh)


def _sync_and_hash(path: Path) -> tuple[str, int]:
    """Flush ``path`` to disk; return its SHA-256 and size in bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
        os.fsync(fh.fileno())
        size = os.fstat(fh.fileno()).st_size
    return digest.hexdigest(), size


def _fsync(directory: Path) -> None:
    """Flush ``directory``'s entries to disk, where the file system can."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


# -- the manifest ---------------------------------------------------------------------------


def _manifest(con: duckdb.DuckDBPyConnection, warehouse: Path, fmt: str,
              written: list[ExportedTable]) -> dict[str, Any]:
    (schema_version,) = con.execute("SELECT max(version) FROM schema_migrations").fetchone()  # type: ignore[misc]
    return {
        "manifest_version": MANIFEST_VERSION,
        "matrun_version": matrun.__version__,
        "duckdb_version": duckdb.__version__,
        "warehouse": os.path.abspath(warehouse),
        "schema_version": schema_version,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "format": fmt,
        "tables": {table.name: {key: value for key, value in asdict(table).items() if key != "name"}
                   for table in written},
    }


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(manifest, indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
