"""The static HTML report over the result warehouse (``matrun report``).

``data`` reads the warehouse's views into Polars DataFrames (the only module that touches
the database), ``shape`` labels and summarises them, ``figures`` draws Plotly figures from
DataFrames, ``sections`` and ``pages`` write the HTML, ``build`` puts it together:
``build_report(warehouse=..., out_dir=...)``.
"""

from __future__ import annotations

from pathlib import Path


def build_report(
    *, warehouse: Path, out_dir: Path, run_id: str | None = None, sweep: str | None = None
) -> Path:
    """Build the report; see ``matrun.reports.build.build_report``."""
    from matrun.reports.build import build_report as build

    return build(warehouse=warehouse, out_dir=out_dir, run_id=run_id, sweep=sweep)


__all__ = ["build_report"]
