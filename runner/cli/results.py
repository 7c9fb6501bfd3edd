"""``matrun ingest``, ``query`` and ``report``: loading bundles into the warehouse and reading it.

Thin wrappers over ``warehouse/ingest.py`` (after ``runner/slurm/jobs.py``'s ``reconcile``
writes the results Slurm ended without), ``warehouse/query.py`` and ``reports/build.py``;
docs/CLI.md.  The report module is imported inside ``report``: it loads Polars and Plotly,
which ``matrun --help`` and the other commands do without.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from matrun.errors import BundleError, InputError
from matrun.runner.cli.common import TableFormatOpt, WarehouseOpt, app, check_format, command, out, resolve_warehouse
from matrun.runner.slurm.jobs import reconcile
from matrun.warehouse.ingest import check_paths
from matrun.warehouse.ingest import ingest as ingest_bundles
from matrun.warehouse.query import QueryRows, stream_query, table_text, visible, write_csv, write_json


@command(app)
def ingest(
    paths: Annotated[list[Path], typer.Argument(
        help="Result directories or bundles to load.", readable=False)],  # check_paths says why
    warehouse: WarehouseOpt = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for another writer to finish.")] = 0.0,
    allow_skipped: Annotated[bool, typer.Option(
        "--allow-skipped", help="Exit 0 even when bundles were skipped (they are still reported).")] = False,
) -> None:
    """Load result bundles from disk into the warehouse (idempotent); exit 1 if any was skipped."""
    check_paths(paths)
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
    if report.skipped and not allow_skipped:
        raise BundleError(f"{len(report.skipped)} bundle(s) skipped (reasons above); they stay on disk "
                          "and are not in the warehouse (--allow-skipped exits 0 all the same)")


@command(app)
def query(
    sql: Annotated[str, typer.Argument(
        metavar="SQL", help="One SQL statement, read-only (e.g. \"SELECT * FROM baseline\"); - reads it from stdin.")],
    warehouse: WarehouseOpt = None,
    fmt: TableFormatOpt = "table",
) -> None:
    """Run SQL over the warehouse (read-only) and print the result."""
    check_format(fmt, ("table", "csv", "json"))
    statement = _stdin_text() if sql == "-" else sql
    with stream_query(statement, warehouse=resolve_warehouse(warehouse)) as rows:
        if fmt == "csv":
            write_csv(rows.columns, rows, sys.stdout)
        elif fmt == "json":
            write_json(rows.columns, rows, sys.stdout)
        else:
            _print_table(rows)


#: The most rows ``matrun query`` shows as a table; CSV and JSON write every row.
TABLE_ROWS = 1000


def _print_table(rows: QueryRows) -> None:
    shown = list(itertools.islice(rows, TABLE_ROWS + 1))  # one more says whether there are more
    table = Table()
    for name, numeric in zip(rows.columns, rows.numeric):
        table.add_column(Text(visible(name)), justify="right" if numeric else "left", overflow="fold")
    for row in shown[:TABLE_ROWS]:
        table.add_row(*(Text(table_text(value)) for value in row))  # Text: no markup is read
    out.print(table)
    if len(shown) > TABLE_ROWS:
        typer.echo(f"the first {TABLE_ROWS} rows; the result has more: add LIMIT and OFFSET, or use "
                   "--format csv or --format json, which write every row")
    else:
        typer.echo(f"{len(shown)} row{'' if len(shown) == 1 else 's'}")


def _stdin_text() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"SQL from stdin: not UTF-8 text (byte {exc.start + 1})") from None


@command(app)
def report(
    warehouse: WarehouseOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", metavar="DIR",
        help="Directory to write the static site into (default: report, unless --publish is given).")] = None,
    run: Annotated[Optional[str], typer.Option(
        metavar="RUN_ID", help="Run id whose CPU and memory time series to show.")] = None,
    sweep_name: Annotated[Optional[str], typer.Option("--sweep", metavar="NAME", help="Only this sweep.")] = None,
    publish: Annotated[Optional[Path], typer.Option(
        "--publish", metavar="DIR", help="Also (or, without --out, only) write a copy for a public static host into "
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
