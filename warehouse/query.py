"""Read-only SQL over the warehouse, for `matrun query` and any other caller.

The connection is read-only and has DuckDB's external access switched off (and its
configuration locked), so a query can neither change the warehouse nor read or write any
other file: ``DROP``, ``INSERT``, ``COPY … TO``, ``read_csv('/etc/passwd')``, ``ATTACH`` and
``INSTALL`` all fail with a :class:`QueryError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from matrun.errors import QueryError
from matrun.warehouse.db import open_warehouse


def run_query(sql: str, *, warehouse: Path | str,
              wait_s: float = 0.0) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` read-only; return ``(column names, rows)``.

    A statement that returns no rows (none that is allowed here changes anything) gives
    ``([], [])``.  Results come through Arrow, so time zone-aware timestamps need no pytz.
    """
    if not sql or not sql.strip():
        raise QueryError('query is empty: give a SQL statement, such as '
                         '"SELECT * FROM run_overview"')
    with open_warehouse(warehouse, read_only=True, wait_s=wait_s) as wh:
        try:
            relation = wh.con.sql(sql)
            if relation is None:
                return [], []
            table = relation.to_arrow_table()
        except duckdb.Error as exc:
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            raise QueryError(f"query failed: {first}") from None
    columns = list(table.column_names)
    rows = list(zip(*(column.to_pylist() for column in table.columns)))
    if not columns:
        return [], []
    return columns, rows
