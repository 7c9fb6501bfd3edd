"""Read-only SQL over the warehouse, for `matrun query` and any other caller, and the three
ways its result is written: a table's text for a person, CSV and JSON for scripts.

The connection is a matrun reader (``db.reader_statements``): read-only, pinned to one
snapshot, allowed to open only that snapshot's files, its configuration locked, so a query can
neither change a byte of the warehouse nor read or write any other file: ``DROP``, ``INSERT``,
``CHECKPOINT``, DuckLake's maintenance calls, ``COPY … TO``, ``read_csv('/etc/passwd')`` and
``INSTALL`` all fail with a :class:`QueryError`.  The SQLite and PostgreSQL extensions open
their databases by themselves, past DuckDB's guard, so :func:`check_statement` refuses what
would use them: ``ATTACH`` (``ATTACH 'x.sqlite' (TYPE sqlite)`` opens a file for writing),
``DETACH``, and any statement whose plan holds one of their functions (``sqlite_scan``),
found by ``EXPLAIN`` after macros, views and ``query()`` are expanded.

Rows stream (:func:`stream_query`): CSV and JSON write a result of any size without holding
it, and a table reads only the rows it shows.  Full precision stays in CSV and JSON; only
the table rounds (:func:`table_text`).  JSON is always valid JSON: NaN and ±Infinity, which
JSON lacks, are written as null (:func:`json_value`).  CSV cells a spreadsheet would run as
a formula get a leading apostrophe (:func:`csv_value`, the rule of the report's CSV files).
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, TextIO

import duckdb
import pyarrow as pa

from matrun.errors import QueryError
from matrun.warehouse.db import open_warehouse

#: Rows fetched from DuckDB at a time while a result streams.
BATCH_ROWS = 10_000
#: At most this many characters of a DuckDB error message are shown (a 1 MB statement may
#: be quoted whole in its own error).
ERROR_CHARS = 300


@dataclass(frozen=True)
class QueryRows:
    """A query's result while it streams: column names, which are numbers, and the rows.

    Iterate over it (once) for the rows as tuples; a DuckDB error met while reading them
    raises :class:`QueryError`.
    """

    columns: list[str]
    numeric: list[bool]  # per column: an integer, floating-point or decimal type
    batches: Iterator[pa.RecordBatch]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        try:
            for batch in self.batches:
                yield from zip(*(column.to_pylist() for column in batch.columns))
        except (duckdb.Error, OSError) as exc:  # pyarrow reports DuckDB's error as an OSError
            raise _query_failed(exc) from None


def run_query(sql: str, *, warehouse: Path | str,
              wait_s: float = 0.0) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` read-only; return ``(column names, rows)``.

    A statement that returns no rows (none that is allowed here changes anything) gives
    ``([], [])``.  Time stamps are naive ``datetime`` values in UTC.
    """
    with stream_query(sql, warehouse=warehouse, wait_s=wait_s) as result:
        return result.columns, list(result)


@contextmanager
def stream_query(sql: str, *, warehouse: Path | str, wait_s: float = 0.0,
                 batch_rows: int = BATCH_ROWS) -> Iterator[QueryRows]:
    """Run ``sql`` read-only; yield its :class:`QueryRows`, read ``batch_rows`` at a time.

    The warehouse stays open until the ``with`` block ends.  An empty statement, one with a
    NUL character (DuckDB would read the text only up to it) and one DuckDB refuses raise
    :class:`QueryError` with DuckDB's first line, cut to ``ERROR_CHARS`` characters.
    """
    check_sql(sql)
    with open_warehouse(warehouse, read_only=True, wait_s=wait_s) as wh:
        try:
            relation = None
            statements = wh.con.extract_statements(sql)
            for n, statement in enumerate(statements, start=1):
                check_statement(wh.con, statement)
                if n < len(statements):
                    wh.con.execute(statement.query)
                else:
                    relation = wh.con.sql(statement.query)
            # to_arrow_reader is DuckDB >= 1.4's name of fetch_record_batch.
            reader = None if relation is None else (
                getattr(relation, "to_arrow_reader", None) or relation.fetch_record_batch)(batch_rows)
        except duckdb.Error as exc:
            raise _query_failed(exc) from None
        if reader is None or not reader.schema.names:
            yield QueryRows([], [], iter(()))
        else:
            numeric = [_is_number(field.type) for field in reader.schema]
            yield QueryRows(list(reader.schema.names), numeric, iter(reader))


def check_sql(sql: str) -> None:
    """Refuse an empty statement and one holding a NUL character (bad input)."""
    if not sql or not sql.strip():
        raise QueryError('query is empty: give a SQL statement, such as '
                         '"SELECT * FROM run_overview"')
    nul = sql.find("\0")
    if nul >= 0:
        raise QueryError(f"query has a NUL character (at character {nul + 1}); "
                         "SQL is text without NUL characters")


#: Statements a reader refuses: ATTACH opens a database the guard does not cover (a SQLite file
#: is opened by the SQLite extension itself, for writing), DETACH takes the lake away, LOAD and
#: INSTALL bring code into the process (DuckDB refuses them too: external access is off; matrun's
#: instances load only matrun's own extensions, catalog.LAKE_CONFIG).
_REFUSED = {duckdb.StatementType.ATTACH: ("ATTACH or DETACH", "ATTACH opens a database matrun's guard does not cover"),
            duckdb.StatementType.DETACH: ("ATTACH or DETACH", "DETACH would take the warehouse, attached as lake, away"),
            duckdb.StatementType.LOAD: ("LOAD or INSTALL an extension",
                                        "a reader runs only the extensions matrun loaded itself")}
#: Statements ``EXPLAIN`` cannot plan, which run no function (checked as they are).
_UNPLANNED = {duckdb.StatementType.SET, duckdb.StatementType.ANALYZE, duckdb.StatementType.VACUUM,
              duckdb.StatementType.TRANSACTION, duckdb.StatementType.EXTENSION,
              duckdb.StatementType.ALTER, duckdb.StatementType.EXPORT}
#: An operator or function of the SQLite or PostgreSQL extension in an ``EXPLAIN (FORMAT json)`` plan.
_FOREIGN = re.compile(r'"(?:name|Function)":\s*"((?:SQLITE|POSTGRES)_[A-Z_]*)"')
#: Leading comments and ``EXPLAIN [ANALYZE | (options)]``: what is left is the statement explained.
_EXPLAIN = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*EXPLAIN\b(?:\s+ANALYZE\b|\s*\([^)]*\))?", re.I | re.S)


def check_statement(con: duckdb.DuckDBPyConnection, statement: duckdb.Statement) -> None:
    """Refuse ``statement`` when it is an ATTACH, DETACH, LOAD or INSTALL, or when its plan uses the SQLite or
    PostgreSQL extension's functions; a statement that cannot be planned and may run functions
    is refused with DuckDB's own error."""
    kind = statement.type
    if kind in _REFUSED:
        what, why = _REFUSED[kind]
        raise QueryError(f"query refused: a read-only query may not {what} ({why})")
    if kind in _UNPLANNED:
        return
    text = statement.query
    if kind == duckdb.StatementType.EXPLAIN:
        text = _EXPLAIN.sub("", text, count=1)
    try:
        plan = "\n".join(str(row[-1]) for row in con.execute(f"EXPLAIN (FORMAT json) {text}").fetchall())
    except duckdb.Error as exc:
        raise _query_failed(exc) from None
    found = _FOREIGN.search(plan)
    if found:
        raise QueryError(f"query refused: it uses {found.group(1).lower()}, a function of DuckDB's "
                         f"{found.group(1).split('_')[0].lower()} extension, which opens databases "
                         "past matrun's guard; read the lake's tables and views (DuckLake's own "
                         "state: ducklake_snapshots('lake'), ducklake_table_info('lake'))")


def _query_failed(exc: BaseException) -> QueryError:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if len(first) > ERROR_CHARS:
        first = first[:ERROR_CHARS] + f"… ({len(first)} characters)"
    return QueryError(f"query failed: {visible(first)}")


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


# -- values as text ---------------------------------------------------------------------------

# Characters a terminal would act on rather than show: C0 and C1 controls but the newline
# (escape sequences, carriage returns, NUL) and the bidirectional overrides that reorder
# what is shown (U+202A-U+202E, U+2066-U+2069).
_UNSHOWABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character written as its Python escape (``\\x1b``, ``\\r``)."""
    return _UNSHOWABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def short_float(value: float) -> str:
    """A float for reading: 4 significant digits (``3.142``, ``0.001235``, ``1.235e-05``).

    Whole numbers of 10,000 and more keep every digit before the point and lose the
    decimals (``12346``, not ``1.235e+04``) up to 10^16; NaN and infinities read ``nan``,
    ``inf`` and ``-inf``; zero reads ``0``.
    """
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    text = f"{value:.4g}"
    if "e+" in text and abs(value) < 1e16:
        return f"{value:.0f}"
    return text


def table_text(value: Any) -> str:
    """A value as a table cell shows it: floats rounded (:func:`short_float`), ``NULL`` for
    null, ``true``/``false``, lists and structs as JSON, control characters made visible."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return short_float(value)
    if isinstance(value, (list, tuple, dict)):
        return visible(json.dumps(_rounded(value), ensure_ascii=False, default=str))
    return visible(str(value))


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(short_float(value)) if math.isfinite(value) else value
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def json_value(value: Any) -> Any:
    """A value as JSON holds it, exactly: NaN and ±Infinity (not JSON) as ``None`` (null).

    Numbers stay numbers (an integral DECIMAL or HUGEINT as an exact integer, any other
    DECIMAL as a double); dates and times as ISO 8601 text; lists, structs and maps as
    arrays and objects; anything else (BLOB, INTERVAL, UUID) as its text.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None
        return int(value) if value.as_tuple().exponent >= 0 else float(value)  # type: ignore[operator]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


# A spreadsheet treats a cell that starts with one of these as a formula (CSV injection);
# the same rule as the report's CSV files (matrun.reports.pages).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_value(value: Any) -> str:
    """A value as a CSV cell: numbers in full precision (``repr``; ``nan``, ``inf``), null
    empty, ``true``/``false``, lists and structs as JSON, dates in ISO 8601; text a
    spreadsheet would run as a formula gets a leading apostrophe (numbers never do)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, Decimal)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, (list, tuple, dict)):
        text = json.dumps(json_value(value), ensure_ascii=False)
    elif isinstance(value, (datetime, date, time)):
        text = value.isoformat()
    else:
        text = str(value)
    return f"'{text}" if text.startswith(FORMULA_PREFIXES) else text


# -- whole results ----------------------------------------------------------------------------


def json_keys(columns: Sequence[str]) -> list[str]:
    """Column names as JSON object keys: a repeated name gets ``_1``, ``_2``… (DuckDB's own
    rule for a subquery's repeated names), so no column is lost."""
    seen: set[str] = set()
    keys = []
    for name in columns:
        key, n = name, 0
        while key in seen:
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


def write_json(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO) -> int:
    """Write ``rows`` as a JSON array of objects, one per line, as they come; return how many."""
    keys = json_keys(columns)
    count = 0
    out.write("[")
    for row in rows:
        out.write(",\n  " if count else "\n  ")
        out.write(json.dumps(dict(zip(keys, map(json_value, row))), allow_nan=False))
        count += 1
    out.write("\n]\n" if count else "]\n")
    return count


def write_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO) -> int:
    """Write a header and ``rows`` as CSV (:func:`csv_value`), as they come; return how many.

    Lines end in LF; a field holding a comma, a quote, a CR or an LF is quoted (RFC 4180),
    so it reads back as one field.
    """
    out.write(",".join(_csv_field(csv_value(c)) for c in columns) + "\n")
    count = 0
    for row in rows:
        out.write(",".join(_csv_field(csv_value(v)) for v in row) + "\n")
        count += 1
    return count


def _csv_field(text: str) -> str:
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text
