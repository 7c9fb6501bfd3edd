"""``matrun shell``: the DuckDB command-line client on the warehouse, read-only.

A thin wrapper over ``warehouse/shell.py`` (``run_shell``); docs/CLI.md, docs/WAREHOUSE.md.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from matrun.runner.cli.common import WarehouseOpt, app, command, resolve_warehouse
from matrun.warehouse.shell import run_shell


@command(app)
def shell(
    warehouse: WarehouseOpt = None,
    args: Annotated[Optional[list[str]], typer.Argument(
        metavar="[-- DUCKDB_ARGS]", help="Arguments for the duckdb client after --, e.g. -- -csv -c \"SELECT "
        "count(*) FROM runs\".")] = None,
) -> None:
    """Open a read-only DuckDB prompt on the warehouse (the duckdb client), from any directory."""
    status = run_shell(resolve_warehouse(warehouse), args=args or [])
    if status:
        raise typer.Exit(status)
