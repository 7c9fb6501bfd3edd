"""Build the static report: read the warehouse, shape, draw, write the site.

``build_report`` is the library twin of ``matrun report``.  The site is one directory that
works from ``file://``: ``index.html``, ``assets/report.css`` and one shared
``assets/plotly.min.js`` copied from the installed plotly package.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
import duckdb
import polars as pl

from matrun.errors import InputError
from matrun.reports import data as reads
from matrun.reports import figures, sections
from matrun.reports.data import ReportData
from matrun.reports.pages import Html, figure, join, render_page, write_site
from matrun.reports.shape import (
    cell_labels,
    choose_run,
    environments_summary,
    hosts_summary,
    in_force_summary,
    monitor_runs,
    varying_params,
)

MAX_MONITOR_RUNS = 20
MAX_MONITOR_POINTS = 500


def build_report(
    *, warehouse: Path, out_dir: Path, run_id: str | None = None, sweep: str | None = None
) -> Path:
    """Write the report of ``warehouse`` (one sweep, or all) into ``out_dir``; return index.html.

    ``run_id`` picks the run whose CPU and memory time series is shown first (default: the
    latest ok run).  ``out_dir`` is replaced whole, and only when it is new, empty or a
    previous report; a failed build leaves the previous report untouched.
    """
    from matrun.warehouse.db import open_warehouse

    with open_warehouse(Path(warehouse), read_only=True) as wh:
        report = read_report_data(wh.con, sweep=sweep, run_id=run_id)
    page = render_report(report, sweep=sweep, source=Path(warehouse).name)
    return write_site(Path(out_dir), {"index.html": page})


def read_report_data(
    con: duckdb.DuckDBPyConnection, *, sweep: str | None = None, run_id: str | None = None
) -> ReportData:
    """Everything the report shows, read from an open warehouse connection."""
    sweeps = reads.read_sweeps(con)
    if sweep is not None and sweeps and sweep not in sweeps:
        raise InputError(
            f"sweep {sweep!r} has no runs in the warehouse; its sweeps are: {', '.join(sweeps)}"
        )
    runs = reads.read_runs(con, sweep)
    selected = choose_run(runs, run_id)
    shown = monitor_runs(runs, selected, limit=MAX_MONITOR_RUNS)
    return ReportData(
        sweeps=sweeps,
        runs=runs,
        baseline=reads.read_baseline(con, sweep),
        epoch_curve=reads.read_epoch_curve(con, sweep),
        provenance=reads.read_provenance(con, sweep),
        monitor=reads.read_monitor(con, shown, max_points=MAX_MONITOR_POINTS),
        selected_run=selected,
    )


def _with_labels(frame: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    if frame.is_empty() and "label" not in frame.columns:
        return frame.with_columns(pl.lit(None, dtype=pl.String).alias("label"))
    joined = frame.join(labels, on=["sweep", "cell_id"], how="left", maintain_order="left")
    return joined.with_columns(pl.coalesce("label", "cell_id").alias("label"))


def render_report(
    report: ReportData, *, sweep: str | None = None, source: str = "",
    generated: datetime | None = None,
) -> str:
    """The report page as HTML text (no I/O)."""
    title = f"matrun report — {sweep}" if sweep else "matrun report"
    runs = report.runs
    if runs.is_empty():
        return render_page(title=title, subtitle=Html("no runs yet"), nav=[],
                           body=sections.empty_section(sweep), generated=generated)

    labels = cell_labels(runs)
    label_of = {(r["sweep"], r["cell_id"]): r["label"] for r in labels.iter_rows(named=True)}
    baseline = _with_labels(report.baseline, labels)
    epochs = _with_labels(report.epoch_curve, labels)
    # Colours (and the order of lines) follow the baseline table, then cells without results.
    colors = figures.cell_colors(
        [*baseline.get_column("label").to_list(), *labels.get_column("label").to_list()]
    )

    params = varying_params(runs.unique(subset=["sweep", "cell_id"], keep="first"))
    if runs.get_column("sweep").n_unique() > 1:
        params = ["sweep", *params]
    cell_params = {
        (r["sweep"], r["cell_id"]): r
        for r in runs.unique(subset=["sweep", "cell_id"], keep="first").iter_rows(named=True)
    }
    unfinished = _unfinished_cells(runs, baseline, label_of)

    shown = monitor_runs(runs, report.selected_run, limit=MAX_MONITOR_RUNS)
    status_of = dict(zip(runs.get_column("run_id").to_list(), runs.get_column("status").to_list()))
    cell_of = {r["run_id"]: (r["sweep"], r["cell_id"]) for r in runs.iter_rows(named=True)}
    menu = [(rid, f"{rid} · {label_of.get(cell_of[rid], '')} · {status_of[rid]}") for rid in shown]
    monitor_fig = figures.monitor_figure(report.monitor, menu, report.selected_run or "")

    body = join([
        sections.summary_cards(runs, baseline),
        sections.baseline_section(
            baseline, params, cell_params, unfinished,
            figure(figures.throughput_figure(baseline, colors), "fig-throughput"),
        ),
        sections.epochs_section(figure(figures.epoch_figure(epochs, colors), "fig-epochs")),
        sections.monitor_section(figure(monitor_fig, "fig-monitor"), report.selected_run,
                                 len(shown), runs.height),
        sections.provenance_section(
            hosts_summary(report.provenance), environments_summary(report.provenance),
            sorted(in_force_summary(report.provenance, runs),
                   key=lambda g: list(colors).index(g.label) if g.label in colors else len(colors)),
        ),
        sections.runs_section(runs, label_of, report.selected_run),
    ], "\n")
    scope = f"sweep {sweep}" if sweep else (
        f"sweep {report.sweeps[0]}" if len(report.sweeps) == 1
        else f"{len(report.sweeps)} sweeps: {', '.join(report.sweeps)}")
    subtitle = join([
        scope, f" · {labels.height} cells · {runs.height} runs",
        f" · warehouse {source}" if source else "",
    ])
    nav = [("baseline", "Baseline"), ("epochs", "Epochs"), ("monitor", "CPU & memory"),
           ("provenance", "Provenance"), ("runs", "Runs")]
    return render_page(title=title, subtitle=subtitle, nav=nav, body=body, generated=generated)


def _unfinished_cells(
    runs: pl.DataFrame, baseline: pl.DataFrame, label_of: dict[tuple[str, str], str]
) -> list[tuple[str, str]]:
    """(label, status counts) of cells that have runs but no row in the baseline."""
    done = set(zip(baseline.get_column("sweep").to_list(), baseline.get_column("cell_id").to_list()))
    counts: dict[tuple[str, str], Counter[str]] = {}
    for r in runs.iter_rows(named=True):
        key = (r["sweep"], r["cell_id"])
        if key not in done:
            counts.setdefault(key, Counter())[str(r["status"])] += 1
    return [
        (label_of.get(key, key[1]), ", ".join(f"{s} ×{n}" for s, n in sorted(c.items())))
        for key, c in counts.items()
    ]
