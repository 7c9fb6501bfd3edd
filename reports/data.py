"""Everything the report reads from the warehouse, as Polars DataFrames.

This is the only module of ``matrun.reports`` that touches the database: one function per
dataset the report shows, each a read of the warehouse's views (docs/WAREHOUSE.md).  The
connection is DuckDB's; results come back through Arrow.  ``sweep=None`` means every sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import duckdb
import polars as pl

_SWEEP_FILTER = "(CAST($sweep AS VARCHAR) IS NULL OR sweep = $sweep)"
_RUNS_SWEEP_FILTER = "(CAST($sweep AS VARCHAR) IS NULL OR o.sweep = $sweep)"
_THREADS_ORDER = "TRY_CAST(threads AS INTEGER) NULLS LAST, threads"


@dataclass(frozen=True)
class ReportData:
    """What one report shows, read in one read-only session."""

    sweeps: list[str]
    """Every sweep in the warehouse (not only the one reported)."""
    runs: pl.DataFrame
    """run_overview rows of the report's sweep(s), with ``error_tail``."""
    baseline: pl.DataFrame
    epoch_curve: pl.DataFrame
    provenance: pl.DataFrame
    monitor: pl.DataFrame
    """Downsampled monitor samples of the runs picked for the time-series figure."""
    selected_run: str | None
    """The run whose time series is shown first (None when there are no runs)."""


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> pl.DataFrame:
    return pl.from_arrow(con.sql(sql, params=params).to_arrow_table())  # type: ignore[return-value]


def read_sweeps(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The names of every sweep with at least one run, sorted."""
    frame = _frame(con, "SELECT DISTINCT sweep FROM run_overview ORDER BY sweep")
    return frame.get_column("sweep").to_list()


def read_runs(con: duckdb.DuckDBPyConnection, sweep: str | None) -> pl.DataFrame:
    """One row per run (run_overview), oldest first, plus its error tail.

    run_overview leaves the error tail out, so it is joined from the ``runs`` table.
    """
    return _frame(
        con,
        f"""
        SELECT o.*, r.error_tail
        FROM run_overview AS o LEFT JOIN runs AS r USING (run_id)
        WHERE {_RUNS_SWEEP_FILTER}
        ORDER BY o.started_at NULLS LAST, o.run_id
        """,
        {"sweep": sweep},
    )


def read_baseline(con: duckdb.DuckDBPyConnection, sweep: str | None) -> pl.DataFrame:
    """The baseline view: per cell, medians and spread over its ok runs."""
    return _frame(
        con,
        f"""
        SELECT * FROM baseline WHERE {_SWEEP_FILTER}
        ORDER BY sweep, framework, variant, model, dataset, {_THREADS_ORDER},
                 batch_size, epochs, cell_id
        """,
        {"sweep": sweep},
    )


def read_epoch_curve(con: duckdb.DuckDBPyConnection, sweep: str | None) -> pl.DataFrame:
    """The epoch_curve view: per cell and epoch, test accuracy and epoch time."""
    return _frame(
        con,
        f"SELECT * FROM epoch_curve WHERE {_SWEEP_FILTER} ORDER BY sweep, cell_id, epoch",
        {"sweep": sweep},
    )


def read_provenance(con: duckdb.DuckDBPyConnection, sweep: str | None) -> pl.DataFrame:
    """The provenance view: per run, host, versions and what was in force."""
    return _frame(
        con,
        f"SELECT * FROM provenance WHERE {_SWEEP_FILTER} ORDER BY sweep, cell_id, run_id",
        {"sweep": sweep},
    )


def read_monitor(
    con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], *, max_points: int = 500
) -> pl.DataFrame:
    """Monitor samples of ``run_ids``, at most ``max_points`` per run.

    Longer series are cut into ``max_points`` consecutive buckets: CPU and iowait are the
    bucket's mean, RSS its maximum (so a memory peak survives downsampling), ``t`` its start.
    """
    return _frame(
        con,
        """
        WITH s AS (
            SELECT run_id, t, cpu_user, cpu_system, iowait, rss_bytes,
                   row_number() OVER (PARTITION BY run_id ORDER BY t) - 1 AS i,
                   count(*) OVER (PARTITION BY run_id) AS n
            FROM monitor_samples
            WHERE list_contains(CAST($ids AS VARCHAR[]), run_id)
        )
        SELECT run_id, min(t) AS t,
               avg(cpu_user) AS cpu_user, avg(cpu_system) AS cpu_system,
               avg(iowait) AS iowait, max(rss_bytes) AS rss_bytes
        FROM s
        GROUP BY run_id, (i * $max_points) // n
        ORDER BY run_id, t
        """,
        {"ids": list(run_ids), "max_points": max_points},
    )
