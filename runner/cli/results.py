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
from rich.console import Console
from rich.table import Table
from rich.text import Text

from matrun.errors import BundleError, InputError
from matrun.runner.cli.common import WarehouseOpt, app, check_format, command, out, resolve_warehouse
from matrun.runner.cli.tables import HIDDEN, column_widths, fit_columns, hidden_note, table_width, vertical_lines
from matrun.runner.slurm.jobs import reconcile
from matrun.warehouse.bundles.quarantine import quarantine_all
from matrun.warehouse.ingest import IngestReport, check_paths
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
    quarantine: Annotated[bool, typer.Option(
        "--quarantine", help="Move each skipped bundle, with its reason, into the .quarantine folder beside it, "
        "which no ingest or sweep reads; exit 0 once every one was moved.")] = False,
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
    if quarantine and report.skipped:
        _quarantine(report)
    elif report.skipped and not allow_skipped:
        raise BundleError(f"{len(report.skipped)} bundle(s) skipped (reasons above); they stay on disk "
                          "and are not in the warehouse (--quarantine sets them aside, --allow-skipped "
                          "exits 0 all the same)")


def _quarantine(report: IngestReport) -> None:
    """Set every skipped bundle aside; ``Error`` (exit 1) when one could not be moved."""
    moved, failed = quarantine_all(report.skipped)
    for item in moved:
        if item.target == item.source:
            typer.echo(f"already in quarantine: {item.source}", err=True)
        else:
            typer.echo(f"quarantined {item.source} -> {item.target}", err=True)
    typer.echo(f"quarantined {len(moved)} bundle(s), {len(failed)} could not be moved")
    if len(failed) == 1:
        raise BundleError(failed[0])
    if failed:
        for message in failed:
            typer.echo(message, err=True)
        raise BundleError(f"{len(failed)} skipped bundle(s) could not be quarantined (reasons above); they "
                          "stay where they were")


@command(app)
def query(
    sql: Annotated[str, typer.Argument(
        metavar="SQL", help="One SQL statement, read-only (e.g. \"SELECT * FROM baseline\"); - reads it from stdin.")],
    warehouse: WarehouseOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table, vertical (one line per "
                                     "column), csv or json.")] = "table",
    wide: Annotated[bool, typer.Option("--wide", help="Table: every column at its full width, as when piped "
                                       "(on a terminal the middle columns that do not fit are hidden).")] = False,
) -> None:
    """Run SQL over the warehouse (read-only) and print the result."""
    check_format(fmt, ("table", "vertical", "csv", "json"))
    if wide and fmt != "table":
        raise InputError(f"--wide: only for --format table (--format {fmt} shows every column)")
    statement = _stdin_text() if sql == "-" else sql
    with stream_query(statement, warehouse=resolve_warehouse(warehouse)) as rows:
        if fmt == "csv":
            write_csv(rows.columns, rows, sys.stdout)
        elif fmt == "json":
            write_json(rows.columns, rows, sys.stdout)
        else:
            _print_rows(rows, vertical=fmt == "vertical", wide=wide or not out.is_terminal)


#: The most rows ``matrun query`` shows as a table; CSV and JSON write every row.
TABLE_ROWS = 1000


def _print_rows(rows: QueryRows, *, vertical: bool, wide: bool) -> None:
    """The first ``TABLE_ROWS`` rows as a table (``wide``: every column at full width, else the
    columns that fit the terminal; ``runner/cli/tables.py``) or one line per column, then the
    row count."""
    shown = list(itertools.islice(rows, TABLE_ROWS + 1))  # one more says whether there are more
    names = [visible(name) for name in rows.columns]
    texts = [[table_text(value) for value in row] for row in shown[:TABLE_ROWS]]
    if vertical:
        for line in vertical_lines(names, texts):
            typer.echo(line)
    else:
        widths = column_widths(names, texts)
        keep = list(range(len(names))) if wide else fit_columns(widths, out.width)
        table = Table()
        for index in keep:
            if index is None:
                table.add_column(HIDDEN, overflow="fold")
            else:
                table.add_column(Text(names[index]), justify="right" if rows.numeric[index] else "left",
                                 overflow="fold")
        for row in texts:
            table.add_row(*(Text(HIDDEN if index is None else row[index]) for index in keep))  # Text: no markup
        console = Console(width=max(table_width(widths), 20)) if wide else out  # full width: nothing folded
        console.print(table)
        if None in keep:
            typer.echo(hidden_note(keep, len(names)))
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
