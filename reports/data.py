"""Everything the report reads from the warehouse, as Polars DataFrames.

This is the only module of ``matrun.reports`` that touches the database: one function per
dataset the report shows, each a read of the warehouse's views (docs/WAREHOUSE.md).  The
connection is DuckDB's; results come back through Arrow.  ``sweep=None`` means every sweep.

The study views (``thread_sweep``, ``batch_sweep``, …) group by *cell* over every sweep, not
by sweep.  For a one-sweep report they are cut down without breaking a comparison: a
configuration view keeps every row of each configuration that has a cell in the sweep (so
the reference cell stays, even when another sweep ran it), a group view (``default_cells``,
``best_vs_default``, ``pareto_front``) every group that has one, a cell view the sweep's cells.
``cut_to_cells`` narrows them to one study's cells (and the references they are compared
with) for its page.

The study catalogue (docs/WAREHOUSE.md, "Studies and findings") is read in the same
session: the ``studies`` table, the findings each declares (``study_findings``), the cells
registered for it (``study_cells``) and the ``findings`` view's verdicts.  A warehouse
without those tables or that view gives empty frames, so it still builds a report (without
study pages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import duckdb
import polars as pl

from matrun.warehouse.history import History

_SWEEP_FILTER = "(CAST($sweep AS VARCHAR) IS NULL OR sweep = $sweep)"
_RUNS_SWEEP_FILTER = "(CAST($sweep AS VARCHAR) IS NULL OR o.sweep = $sweep)"
_THREADS_ORDER = "TRY_CAST(threads AS INTEGER) NULLS LAST, threads"


@dataclass(frozen=True)
class StudyView:
    """How one study view is cut to a sweep, and the order its rows are shown in."""

    order: str
    """ORDER BY of the view's own rows (as ``SELECT * FROM <view>`` would give them)."""
    keep: str
    """``config``: whole configurations with a cell in the sweep; ``group``: whole groups
    (``group_keys``) with a cell in the sweep; ``cell``: the sweep's cells; ``sweep``: the
    view's own sweep column."""
    keys: tuple[str, ...] = ("config",)
    train_only: bool = False
    """For ``group``: only the sweep's training cells make a group count."""


# The study views, in the order the report's pages show them.  Each is read whole, once
# (binding one of these statistics views costs 0.1-0.3 s, so no filter is pushed into
# SQL), then cut to the sweep here.
STUDY_VIEWS: dict[str, StudyView] = {
    "default_cells": StudyView("framework, model, dataset, device, mode", "group",
                               ("framework", "model", "dataset", "device", "mode")),
    "best_vs_default": StudyView("framework, model, dataset, device", "group",
                                 ("framework", "model", "dataset", "device"), train_only=True),
    "pareto_front": StudyView("model, dataset, device, train_s_median, accuracy_median DESC, cell_id",
                              "group", ("model", "dataset", "device"), train_only=True),
    "library_comparison": StudyView("framework, model, dataset, config, variant, onednn DESC, cell_id",
                                    "config"),
    "thread_sweep": StudyView("framework, model, dataset, config, threads_n NULLS LAST, cell_id", "config"),
    "epoch_sweep": StudyView("framework, model, dataset, config, unit, length, cell_id", "config",
                             ("config", "unit")),
    "batch_sweep": StudyView("framework, model, dataset, mode, config, batch_size, cell_id", "config"),
    "batch_resources": StudyView("framework, model, dataset, mode, config, batch_size, cell_id", "config"),
    "batch_lr_grid": StudyView("framework, model, dataset, config, batch_size, iterations, epochs, lr, cell_id",
                               "config"),
    "worker_scaling": StudyView("framework, model, dataset, config, workers, global_batch, cell_id", "config"),
    "epoch_convergence": StudyView("framework, model, dataset, cell_id, epoch", "cell"),
    "layer_breakdown": StudyView("sweep, cell_id, layer_index", "sweep"),
    "layer_kinds": StudyView("sweep, cell_id, total_s DESC, kind", "sweep"),
    "option_effect": StudyView("option, framework, model, dataset, device, config, value, cell_id", "config",
                               ("option", "config")),
    "iteration_model": StudyView("framework, model, dataset, device, workers, batch_size, cell_id, ordinal",
                                 "cell"),
    "iteration_scaling": StudyView("framework, model, dataset, device, config, workers, cell_id", "config"),
}

# Per cell, what the sweep views leave out but the report shows: how many values each
# statistic is over and the true coverage of its interval (below 6 runs it is [min, max]),
# plus the columns that place a cell in a group and the sweeps that ran it.
# The medians and parameters come along for the study pages' tables shaped like a paper's.
_CELL_LEVELS = """
    SELECT cell_id, sweeps, framework, model, dataset, device, mode, runs,
           train_s_n, train_s_ci_level, accuracy_n, accuracy_ci_level,
           throughput_n, throughput_ci_level, throughput_cv, throughput_noisy,
           CAST(params AS VARCHAR) AS params, workers, global_batch,
           train_s_median, test_s_median, accuracy_median, throughput_median, epoch_s_median,
           cpu_total_median, rss_peak_mb, device_memory_peak_mb
    FROM cell_stats
"""

# The study catalogue's tables and view, read when the warehouse has them.
_STUDY_TABLES = {
    "studies": "SELECT * FROM studies ORDER BY study",
    "study_findings": "SELECT * FROM study_findings ORDER BY study, position, finding",
    "study_cells": "SELECT * FROM study_cells ORDER BY study, profile, cell_id",
}


@dataclass(frozen=True)
class Catalogue:
    """The study catalogue as the warehouse holds it (empty frames when it has none)."""

    studies: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The ``studies`` table: one row per study declared (``paper`` is JSON text)."""
    findings_declared: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The ``study_findings`` table: each study's findings, as declared."""
    cells: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The ``study_cells`` table: (study, profile, cell_id) of every registered cell."""
    findings: pl.DataFrame = field(default_factory=pl.DataFrame)
    """The ``findings`` view: one verdict per (study, finding, configuration)."""


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
    studies: dict[str, pl.DataFrame] = field(default_factory=dict)
    """The study views (``STUDY_VIEWS``) by name, cut to the report's sweep."""
    cell_levels: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Per cell: n and interval coverage of each statistic (from cell_stats)."""
    images: pl.DataFrame = field(default_factory=pl.DataFrame)
    """Every image ``matrun build`` recorded, with how many of the report's runs used it."""
    catalogue: Catalogue = field(default_factory=lambda: Catalogue())
    """The studies registered in the warehouse, their findings and verdicts."""
    history: History | None = None
    """Every workload of the report's sweep(s) across framework releases (``matrun history``'s
    throughput points); None when not read."""
    tunings: list[dict[str, Any]] = field(default_factory=list)
    """The tunings of ``matrun tune`` (warehouse/tunings.py ``read_tunings``), each with its trials."""

    def study(self, name: str) -> pl.DataFrame:
        """The rows of one study view (an empty frame when it was not read)."""
        return self.studies.get(name, pl.DataFrame())


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


def read_bundle_paths(con: duckdb.DuckDBPyConnection, sweep: str | None) -> list[str]:
    """Where the report's runs' bundles lie on this machine (never shown; see publish)."""
    frame = _frame(
        con,
        f"SELECT DISTINCT bundle_path FROM runs WHERE {_SWEEP_FILTER} AND bundle_path IS NOT NULL",
        {"sweep": sweep},
    )
    return frame.get_column("bundle_path").to_list()


#: What ``read_baseline`` adds to the baseline view's columns, for the cell table's flags (the
#: report's baseline.csv is the view's rows: site.py drops them there).
BASELINE_FLAG_COLUMNS = ("bimodal", "slow_runs", "slow_throughput_median", "fast_runs",
                         "fast_throughput_median", "drifted_runs")


def read_baseline(con: duckdb.DuckDBPyConnection, sweep: str | None) -> pl.DataFrame:
    """The baseline view: per cell, medians and spread over its ok runs; then whether the
    cell's runs fall into two modes and the modes (view cell_modes, over every sweep), and how
    many of its ok runs in the sweep were measured while the canary had drifted (run_drift)."""
    return _frame(
        con,
        f"""
        SELECT b.*, m.bimodal, m.slow_runs, m.slow_throughput_median, m.fast_runs,
               m.fast_throughput_median, coalesce(d.drifted_runs, 0) AS drifted_runs
        FROM baseline AS b
        LEFT JOIN cell_modes AS m USING (cell_id)
        LEFT JOIN (SELECT sweep, cell_id, count(*) FILTER (WHERE drift_flagged) AS drifted_runs
                   FROM run_drift WHERE status = 'ok' GROUP BY sweep, cell_id) AS d USING (sweep, cell_id)
        WHERE {_SWEEP_FILTER}
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


def read_study(con: duckdb.DuckDBPyConnection, view: str, sweep: str | None,
               levels: pl.DataFrame | None = None) -> pl.DataFrame:
    """One study view's rows (every column, as the view has them), cut to ``sweep``.

    ``levels`` (``read_cell_levels``) says which cells the sweep ran; read when not given.
    """
    spec = STUDY_VIEWS[view]
    frame = _frame(con, f"SELECT * FROM {view} ORDER BY {spec.order}")
    if sweep is None or frame.is_empty():
        return frame
    if spec.keep == "sweep":
        return frame.filter(pl.col("sweep") == sweep)
    cells = levels if levels is not None else read_cell_levels(con)
    swept = cells.filter(pl.col("sweeps").list.contains(sweep))
    if spec.keep == "cell":
        return frame.filter(pl.col("cell_id").is_in(swept.get_column("cell_id").to_list()))
    if spec.keep == "config":
        inside = frame.filter(pl.col("cell_id").is_in(swept.get_column("cell_id").to_list()))
        return frame.join(inside.select(spec.keys).unique(), on=list(spec.keys), how="semi",
                          nulls_equal=True, maintain_order="left")
    if spec.train_only:
        swept = swept.filter(pl.col("mode") == "train")
    groups = swept.select(spec.keys).unique()
    return frame.join(groups, on=list(spec.keys), how="semi", nulls_equal=True,
                      maintain_order="left")


def cut_to_cells(view: str, frame: pl.DataFrame, cell_ids: Sequence[str]) -> pl.DataFrame:
    """The rows of a study view about ``cell_ids`` (a study's cells), plus the rows of the
    reference cells they are compared with, in the view's order.  Pure (no database).

    A row is about a cell when its ``cell_id`` is one of them (``best_vs_default``: its best
    or default cell is); a reference row is the row of a kept row's ``ref_cell_id`` in the
    same configuration, so a speedup on the page still has its reference beside it.
    """
    if frame.is_empty():
        return frame
    ids = list(cell_ids)
    if "cell_id" not in frame.columns:
        columns = [c for c in ("best_cell_id", "default_cell_id") if c in frame.columns]
        if not columns:
            return frame.clear()
        return frame.filter(pl.any_horizontal([pl.col(c).is_in(ids) for c in columns]))
    mine = frame.with_row_index("_row").filter(pl.col("cell_id").is_in(ids))
    rows = set(mine.get_column("_row").to_list())
    if "ref_cell_id" in frame.columns:
        keys = [k for k in STUDY_VIEWS[view].keys if k in frame.columns] if view in STUDY_VIEWS else []
        refs = mine.select([*keys, "ref_cell_id"]).unique().rename({"ref_cell_id": "cell_id"})
        ref_rows = frame.with_row_index("_row").join(refs, on=[*keys, "cell_id"], how="semi",
                                                     nulls_equal=True)
        rows |= set(ref_rows.get_column("_row").to_list())
    return frame.with_row_index("_row").filter(pl.col("_row").is_in(sorted(rows))).drop("_row")


def read_studies(con: duckdb.DuckDBPyConnection, sweep: str | None,
                 levels: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """Every study view, by name."""
    if sweep is not None and levels is None:
        levels = read_cell_levels(con)
    return {view: read_study(con, view, sweep, levels) for view in STUDY_VIEWS}


def read_cell_levels(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per cell: the n of each statistic and its interval's coverage (cell_stats)."""
    return _frame(con, _CELL_LEVELS + " ORDER BY cell_id")


def _relations(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The names of the tables and views of the warehouse's main schema."""
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
        "UNION ALL SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal"
    ).fetchall()
    return {row[0] for row in rows}


def read_catalogue(con: duckdb.DuckDBPyConnection) -> Catalogue:
    """The studies, their declared findings, their registered cells and the findings view.

    A warehouse without the catalogue's tables (or view) gives empty frames; the findings
    view (it binds the statistics views) is read only when some study has a cell.
    """
    present = _relations(con)
    frames = {name: _frame(con, sql) if name in present else pl.DataFrame()
              for name, sql in _STUDY_TABLES.items()}
    findings = pl.DataFrame()
    if not frames["study_cells"].is_empty() and "findings" in present:
        findings = _frame(con, "SELECT * FROM findings")
    return Catalogue(studies=frames["studies"], findings_declared=frames["study_findings"],
                     cells=frames["study_cells"], findings=findings)


def read_images(con: duckdb.DuckDBPyConnection, sweep: str | None) -> pl.DataFrame:
    """The images table with, per image, how many of the report's runs used it."""
    return _frame(
        con,
        f"""
        SELECT i.tag, i.framework, i.variant, i.framework_version, i.python, i.blas, i.onednn,
               i.openmp, i.cuda, i.cudnn, i.base_image, i.size_bytes, i.build_seconds,
               i.recorded_at, i.image_id,
               (SELECT count(*) FROM runs AS r
                 WHERE r.image_tag = i.tag AND {_SWEEP_FILTER}) AS runs
        FROM images AS i
        ORDER BY i.framework, i.variant, i.recorded_at DESC, i.tag
        """,
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
