"""A warehouse opened the way any DuckDB client opens it, without matrun's code.

``plain_connect(path)`` runs the warehouse's ``attach.sql`` in a bare DuckDB connection, as a
user's own script or the DuckDB CLI would; ``plain_writer(path)`` attaches it writable (what
a test does to fake an older warehouse's state).
"""

from __future__ import annotations

from pathlib import Path

import duckdb


def plain_connect(path: Path | str) -> duckdb.DuckDBPyConnection:
    """A bare DuckDB connection reading the warehouse at ``path`` through its ``attach.sql``."""
    con = duckdb.connect()
    con.execute((Path(path) / "attach.sql").read_text(encoding="utf-8"))
    return con


def plain_writer(path: Path | str) -> duckdb.DuckDBPyConnection:
    """The same, attached writable (``attach.sql`` without its READ_ONLY)."""
    con = duckdb.connect()
    text = (Path(path) / "attach.sql").read_text(encoding="utf-8")
    con.execute(text.replace("(READ_ONLY, ", "("))
    return con
