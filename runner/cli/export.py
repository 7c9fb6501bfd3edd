"""``matrun export``: tables and views of the warehouse as Parquet or CSV files with a manifest.

A thin wrapper over ``warehouse/export.py``; docs/WAREHOUSE.md "Export".
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from matrun.runner.cli.common import WarehouseOpt, app, check_format, command, resolve_warehouse
from matrun.warehouse.export import FORMATS, MANIFEST, export_warehouse


@command(app)
def export(
    out_dir: Annotated[Path, typer.Argument(
        metavar="OUT_DIR", help="Directory to write: new or empty (--force replaces an earlier export).")],
    tables: Annotated[list[str], typer.Option(
        "--table", "-t", metavar="NAME", help="Only this table or view (repeatable; default: every table "
        "and every matrun view).")] = [],
    fmt: Annotated[str, typer.Option(
        "--format", "-f", metavar="FORMAT", help="parquet (the default) or csv.")] = "parquet",
    force: Annotated[bool, typer.Option(
        "--force", help="Replace OUT_DIR when it holds an earlier export (once the new one is complete).")] = False,
    warehouse: WarehouseOpt = None,
) -> None:
    """Write tables and views of the warehouse as Parquet or CSV files, with a manifest.json."""
    check_format(fmt, FORMATS)
    done = export_warehouse(out_dir, warehouse=resolve_warehouse(warehouse), tables=tables or None,
                            fmt=fmt, force=force)
    kinds = [table.kind for table in done.tables]
    rows = sum(table.rows for table in done.tables)
    typer.echo(f"exported {kinds.count('table')} table(s) and {kinds.count('view')} view(s), {rows} rows, "
               f"as {fmt} to {done.out_dir} (manifest: {done.out_dir / MANIFEST})")
