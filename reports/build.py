"""Build the static report: read the warehouse, shape, draw, write the site.

``build_report`` is the library twin of ``matrun report``.  The site is one directory that
works from ``file://`` and from any static host: ``index.html``, a page per section with
data (``site.PAGES``), a CSV file per table, ``assets/report.css`` and one shared
``assets/plotly.min.js`` copied from the installed plotly package.  ``publish=True`` writes
the copy meant for a public host: every absolute path in the data is cut to its last part
and the build fails rather than write a path of this machine.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Iterable, Mapping

import duckdb

from matrun.errors import InputError, MatrunError
from matrun.reports import data as reads
from matrun.reports.data import ReportData
from matrun.reports.pages import check_replaceable, write_site
from matrun.reports.shape import choose_run, mask_frame, monitor_runs
from matrun.reports.site import INDEX, MAX_MONITOR_RUNS, render_site
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.history import read_history
from matrun.warehouse.tunings import read_tunings

MAX_MONITOR_POINTS = 500


class PublishLeak(MatrunError):
    """A page meant for publishing would show a path of this machine."""


def build_report(
    *, warehouse: Path, out_dir: Path, run_id: str | None = None, sweep: str | None = None,
    publish: bool = False,
) -> Path:
    """Write the report of ``warehouse`` (one sweep, or all) into ``out_dir``; return index.html.

    ``run_id`` picks the run whose CPU and memory time series is shown first (default: the
    latest ok run).  ``out_dir`` is replaced whole, and only when it is new, empty or a
    previous report; a failed build leaves the previous report untouched.  ``publish``
    masks absolute paths in the data (library paths, error tails) to their last part,
    leaves the warehouse's name out, and refuses to write any page that still holds the
    warehouse's, the bundles' or the output's location.
    """
    check_replaceable(Path(out_dir))  # refuse before the work, not after (checked again at the swap)
    with open_warehouse(Path(warehouse), read_only=True) as wh:
        report = read_report_data(wh.con, sweep=sweep, run_id=run_id)
        bundles = reads.read_bundle_paths(wh.con, sweep) if publish else []
    if publish:
        report = mask_report(report)
    files = render_site(report, sweep=sweep, source="" if publish else Path(warehouse).name)
    if publish:
        check_no_local_paths(files, local_paths(warehouse=Path(warehouse), out_dir=Path(out_dir),
                                                bundles=bundles))
    return write_site(Path(out_dir), files)


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
    levels = reads.read_cell_levels(con)
    return ReportData(
        sweeps=sweeps,
        runs=runs,
        baseline=reads.read_baseline(con, sweep),
        epoch_curve=reads.read_epoch_curve(con, sweep),
        provenance=reads.read_provenance(con, sweep),
        monitor=reads.read_monitor(con, shown, max_points=MAX_MONITOR_POINTS),
        selected_run=selected,
        studies=reads.read_studies(con, sweep, levels),
        cell_levels=levels,
        images=reads.read_images(con, sweep),
        catalogue=reads.read_catalogue(con),
        history=read_history(con, sweep=sweep),
        tunings=[t for t in read_tunings(con) if sweep is None or t["sweep"] == sweep],
    )


def render_report(
    report: ReportData, *, sweep: str | None = None, source: str = "",
    generated: datetime | None = None,
) -> str:
    """The report's front page (index.html) as HTML text (no I/O); see ``site.render_site``."""
    return render_site(report, sweep=sweep, source=source, generated=generated)[INDEX]


# --- publishing ----------------------------------------------------------------------------


def mask_report(report: ReportData) -> ReportData:
    """The report with every absolute path in its text cut to ``…/<last part>``."""
    return replace(
        report,
        runs=mask_frame(report.runs), baseline=mask_frame(report.baseline),
        epoch_curve=mask_frame(report.epoch_curve), provenance=mask_frame(report.provenance),
        studies={name: mask_frame(frame) for name, frame in report.studies.items()},
        images=mask_frame(report.images), cell_levels=mask_frame(report.cell_levels),
        catalogue=replace(report.catalogue, **{
            name: mask_frame(getattr(report.catalogue, name))
            for name in ("studies", "findings_declared", "cells", "findings")}),
        tunings=[{**t, "matrix": Path(str(t["matrix"])).name} for t in report.tunings],
    )


def local_paths(*, warehouse: Path, out_dir: Path, bundles: Iterable[str]) -> list[str]:
    """The locations of this machine that a published page must never contain.

    The warehouse and output directory (and their parents), every bundle directory and the
    results directory that holds them, the current directory and the home directory; a
    path of fewer than two parts (``/tmp``) is too common a string to test for.
    """
    paths: set[str] = set()
    for path in (Path(os.path.abspath(warehouse)), Path(os.path.abspath(out_dir))):
        paths.update({str(path), str(path.parent)})
    bundle_list = [str(b) for b in bundles]
    paths.update(bundle_list)
    if bundle_list:
        paths.add(os.path.commonpath(bundle_list))
    paths.update({os.getcwd(), os.path.expanduser("~")})
    return sorted(p for p in paths if len(Path(p).parts) >= 3)


def check_no_local_paths(files: Mapping[str, str], forbidden: Iterable[str]) -> None:
    """Raise ``PublishLeak`` when a file to be published contains one of ``forbidden``."""
    for name, text in files.items():
        for path in forbidden:
            if path in text:
                raise PublishLeak(
                    f"refusing to publish: {name} would contain the local path {path}; "
                    "nothing was written"
                )
