"""``matrun ingest``, ``query`` and ``report``: loading bundles into the warehouse and reading it.

Thin wrappers over ``warehouse/ingest.py`` (after ``runner/slurm/jobs.py``'s ``reconcile``
writes the results Slurm ended without), ``warehouse/query.py`` and ``reports/build.py``;
docs/CLI.md.  The report module is imported inside ``report``: it loads Polars and Plotly,
which ``matrun --help`` and the other commands do without.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from matrun.errors import InputError
from matrun.runner.cli.common import TableFormatOpt, WarehouseOpt, app, check_format, command, out, resolve_warehouse
from matrun.runner.slurm.jobs import reconcile
from matrun.warehouse.ingest import ingest as ingest_bundles
from matrun.warehouse.query import run_query


@command(app)
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Result directories or bundles to load.")],
    warehouse: WarehouseOpt = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for another writer to finish.")] = 0.0,
) -> None:
    """Load result bundles from disk into the warehouse (idempotent)."""
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: no such file or directory")
    written, notes = reconcile(paths)  # runs Slurm ended without a result.json get one from Slurm's state
    if written:
        typer.echo(f"recorded {written} run(s) Slurm ended from Slurm's state", err=True)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    report = ingest_bundles(paths, warehouse=resolve_warehouse(warehouse), wait_s=wait)
    typer.echo(report.summary())
    for path, reason in report.skipped:
        typer.echo(f"skipped {path}: {reason}", err=True)
    for path in report.incomplete:
        typer.echo(f"incomplete (no result.json yet): {path}", err=True)


@command(app)
def query(
    sql: Annotated[str, typer.Argument(help="One SQL statement, read-only (e.g. \"SELECT * FROM baseline\").")],
    warehouse: WarehouseOpt = None,
    fmt: TableFormatOpt = "table",
) -> None:
    """Run SQL over the warehouse (read-only) and print the result."""
    check_format(fmt, ("table", "csv", "json"))
    columns, rows = run_query(sql, warehouse=resolve_warehouse(warehouse))
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(columns)
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
    elif fmt == "json":
        sys.stdout.write(json.dumps([dict(zip(columns, r)) for r in rows], default=str, indent=2) + "\n")
    else:
        table = Table()
        for c in columns:
            table.add_column(str(c), overflow="fold")
        for r in rows:
            table.add_row(*["NULL" if v is None else str(v) for v in r])
        out.print(table)
        typer.echo(f"{len(rows)} rows")


@command(app)
def report(
    warehouse: WarehouseOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Directory to write the static site into (default: report, unless --publish is given).")] = None,
    run: Annotated[Optional[str], typer.Option(help="Run id whose CPU and memory time series to show.")] = None,
    sweep_name: Annotated[Optional[str], typer.Option("--sweep", help="Only this sweep.")] = None,
    publish: Annotated[Optional[Path], typer.Option(
        "--publish", help="Also (or, without --out, only) write a copy for a public static host into "
        "this directory: relative links only, absolute paths in the data cut to their last part.")] = None,
) -> None:
    """Write the static HTML report (works from file://) and print where it is."""
    from matrun.reports.build import build_report  # Polars and Plotly: only for this command

    wh = resolve_warehouse(warehouse)
    if out_dir is not None or publish is None:
        index = build_report(warehouse=wh, out_dir=out_dir or Path("report"), run_id=run, sweep=sweep_name)
        typer.echo(f"report: {index.resolve()}")
    if publish is not None:
        index = build_report(warehouse=wh, out_dir=publish, run_id=run, sweep=sweep_name, publish=True)
        typer.echo(f"published: {index.resolve()}")
