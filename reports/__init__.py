"""The static HTML report over the result warehouse (``matrun report``).

``data`` reads the warehouse's views into Polars DataFrames (the only module that touches
the database), ``shape`` labels and summarises them, ``figures`` draws Plotly figures from
DataFrames (``study_figures`` those of the study pages), ``sections`` and ``study_sections``
render the HTML of each page, ``site`` decides which pages exist and assembles them with their
CSV files, ``pages`` escapes and writes, ``build`` puts it together:
``build_report(warehouse=..., out_dir=..., publish=False)``.
"""

from __future__ import annotations

from pathlib import Path


def build_report(
    *, warehouse: Path, out_dir: Path, run_id: str | None = None, sweep: str | None = None,
    publish: bool = False,
) -> Path:
    """Build the report; see ``matrun.reports.build.build_report``."""
    from matrun.reports.build import build_report as build

    return build(warehouse=warehouse, out_dir=out_dir, run_id=run_id, sweep=sweep, publish=publish)


__all__ = ["build_report"]
