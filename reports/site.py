"""The pages of the report site: which pages exist, what each shows, and its CSV files.

``render_site`` turns a ``ReportData`` into ``{relative path: text}``: ``index.html``, one
page per section whose view has rows (``PAGES``), one page per study present
(``study-<id>.html``: its verdicts, the paper's table beside this host's, and the study's
view cut to its cells, drawn by the same builders as the section pages), and a CSV file of
every table's rows next to the pages.  Pure: no database, no files; ``build`` writes the
result.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Mapping

import polars as pl

from matrun.reports import figures, sections
from matrun.reports import study_figures as sf
from matrun.reports import study_pages as sp
from matrun.reports import study_sections as ss
from matrun.reports import tune_pages as tp
from matrun.reports.data import BASELINE_FLAG_COLUMNS, ReportData, cut_to_cells
from matrun.reports.pages import Html, csv_text, figure, join, render_page, tag
from matrun.reports.sections import section
from matrun.warehouse import history as hist
from matrun.reports.shape import (
    InForce,
    cell_labels,
    environments_summary,
    hosts_summary,
    in_force_summary,
    monitor_runs,
    row_labels,
    varying_params,
)

MAX_MONITOR_RUNS = 20
# Per page, at most this many figures of one kind (one per configuration or cell).
MAX_FIGURES = 6
# The convergence figure draws at most this many cells.
MAX_CONVERGENCE_CELLS = 10


@dataclass(frozen=True)
class PageSpec:
    """One page of the site: its file, its link text, its title and what it answers."""

    file: str
    nav: str
    title: str
    about: str


PAGES: tuple[PageSpec, ...] = (
    PageSpec("baseline.html", "Baseline", "Baseline and best settings against the defaults",
             "Per cell medians and spread; each framework at its defaults (A1) and the best "
             "settings found against them."),
    PageSpec("libraries.html", "Libraries", "Math libraries (A4–A5)",
             "BLAS build and oneDNN on / off, with CPU use and memory, against the default library."),
    PageSpec("threads.html", "Threads", "Threads (A6)",
             "Throughput and time against the thread setting; where over-subscription starts."),
    PageSpec("epochs.html", "Epochs", "Training length (A7)",
             "Accuracy and training time against epochs or iterations, twin axes."),
    PageSpec("batch.html", "Batch size", "Batch size (A8, B2–B3; resources A11, B1)",
             "Throughput, time per epoch, accuracy, CPU and memory against the batch size."),
    PageSpec("batch-lr.html", "Batch × LR", "Batch size × length × learning rate (A9–A10)",
             "Accuracy over batch size and learning rate, diverged runs marked NaN."),
    PageSpec("scaling.html", "Scaling", "Scaling over workers (A3, B4–B6, E Fig 10)",
             "Speedup and efficiency against the number of workers, with the linear limit."),
    PageSpec("convergence.html", "Convergence", "Convergence per epoch (B7)",
             "Test accuracy and time epoch by epoch, with the spread over repeats."),
    PageSpec("layers.html", "Layers", "Layer-wise time (D Figs 6–7, E Fig 7)",
             "Forward and backward time per layer and the share of each kind of layer."),
    PageSpec("iterations.html", "Step time", "Where the time goes (C)",
             "Each training step split into its phases and what no phase accounts for; the "
             "model's predicted multi-worker speedup against the measured one."),
    PageSpec("options.html", "Options", "Framework options (E; D Fig 3)",
             "Convolution algorithm, layout, precision and oneDNN against matrun's default."),
    PageSpec("pareto.html", "Pareto", "Training time against accuracy: the Pareto front",
             "Which cells are the best trade-offs between training time and accuracy."),
    PageSpec("releases.html", "Releases", "Across framework releases",
             "Each workload's throughput release by release, each change tested against the release "
             "before (matrun history)."),
    PageSpec("provenance.html", "Provenance", "Provenance",
             "Hosts, images, versions and what was really in force, mismatches flagged."),
    PageSpec("runs.html", "Runs", "Runs and CPU / memory over time",
             "Every run with its status and error tail; CPU and memory time series."),
)
INDEX = "index.html"


@dataclass(frozen=True)
class PageBody:
    """A rendered page body: its in-page anchors, its CSV files and how many rows it shows."""

    body: Html
    anchors: list[tuple[str, str]]
    csv: dict[str, str]
    rows: int


@dataclass(frozen=True)
class Context:
    """What every page builder needs besides the data."""

    report: ReportData
    labels: pl.DataFrame
    """Cell labels per (sweep, cell_id) of the report's runs."""
    colors: dict[str, str]
    levels: dict[str, dict[str, Any]]
    """cell_stats's n and interval coverage per cell_id."""
    csv_prefix: str = ""
    """Put before the name of every CSV file a page writes (a study page's tables)."""

    def csv(self, name: str) -> str:
        """The file name of the CSV called ``name`` on this page."""
        return self.csv_prefix + name


def cell_label_map(ctx: Context, frame: pl.DataFrame, **kwargs: Any) -> dict[Any, str]:
    """Labels of the cells of a study view keyed by cell_id: the report's own cell labels
    (the same on every page), else labels from the view's columns (a cell another sweep ran)."""
    own: dict[Any, str] = {}
    for row in ctx.labels.iter_rows(named=True):
        own.setdefault(row["cell_id"], row["label"])
    labels = row_labels(frame, key="cell_id", **kwargs)
    mine = {k: own[k] for k in labels if k in own}
    taken = set(mine.values())
    other = {k: f"{v} ({str(k)[:8]})" if v in taken else v for k, v in labels.items() if k not in own}
    return {**labels, **mine, **other}


def frame_csv(frame: pl.DataFrame) -> str:
    """A view's rows as CSV: every column, in the view's order."""
    return csv_text(frame.columns, frame.iter_rows())


def _with_labels(frame: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    if frame.is_empty() and "label" not in frame.columns:
        return frame.with_columns(pl.lit(None, dtype=pl.String).alias("label"))
    joined = frame.join(labels, on=["sweep", "cell_id"], how="left", maintain_order="left")
    return joined.with_columns(pl.coalesce("label", "cell_id").alias("label"))


# --- the pages ------------------------------------------------------------------------------


def _baseline_page(ctx: Context) -> PageBody | None:
    report = ctx.report
    if report.baseline.is_empty():
        return None
    runs = report.runs
    baseline = _with_labels(report.baseline, ctx.labels)
    epochs = _with_labels(report.epoch_curve, ctx.labels)
    params = varying_params(runs.unique(subset=["sweep", "cell_id"], keep="first"))
    if runs.get_column("sweep").n_unique() > 1:
        params = ["sweep", *params]
    cell_params = {(r["sweep"], r["cell_id"]): r
                   for r in runs.unique(subset=["sweep", "cell_id"], keep="first").iter_rows(named=True)}
    label_of = {(r["sweep"], r["cell_id"]): r["label"] for r in ctx.labels.iter_rows(named=True)}
    parts = [
        sections.baseline_section(
            baseline, params, cell_params, unfinished_cells(runs, baseline, label_of),
            figure(figures.throughput_figure(baseline, ctx.colors), "fig-throughput"),
            csv_href=ctx.csv("baseline.csv")),
        sections.epochs_section(figure(figures.epoch_figure(epochs, ctx.colors), "fig-epochs"),
                                csv_href=ctx.csv("epoch_curve.csv")),
    ]
    anchors = [("baseline", "Baseline"), ("epochs", "Per epoch")]
    csv = {ctx.csv("baseline.csv"): frame_csv(report.baseline.drop(BASELINE_FLAG_COLUMNS, strict=False)),
           ctx.csv("epoch_curve.csv"): frame_csv(report.epoch_curve)}
    defaults, best = report.study("default_cells"), report.study("best_vs_default")
    if not defaults.is_empty():
        parts.append(section(
            "defaults", "Each framework at its default settings (A1)",
            "The cell that ran each framework with its own default settings (docs/WAREHOUSE.md, "
            "'The default cell'): medians with their confidence intervals. A group without "
            "exactly one such cell says why.",
            figure(sf.defaults_figure(defaults), "fig-defaults"),
            ss.defaults_table(defaults, ctx.levels, csv_href=ctx.csv("default_cells.csv"))))
        anchors.append(("defaults", "Defaults"))
        csv[ctx.csv("default_cells.csv")] = frame_csv(defaults)
    if not best.is_empty():
        parts.append(section(
            "best", "Best settings against the defaults",
            "How much faster each framework trains than at its defaults without losing "
            "accuracy; only a significant difference is called faster.",
            figure(sf.best_figure(best), "fig-best"),
            ss.best_table(best, csv_href=ctx.csv("best_vs_default.csv"))))
        anchors.append(("best", "Best vs default"))
        csv[ctx.csv("best_vs_default.csv")] = frame_csv(best)
    return PageBody(join(parts, "\n"), anchors, csv, report.baseline.height)


def _study_page(view: str, anchor: str, title: str, lead: str,
                content: Callable[[Context, pl.DataFrame], list[Any]]) -> Callable[[Context], PageBody | None]:
    """A page of one study view: absent without rows, else its content and its CSV."""
    def build(ctx: Context) -> PageBody | None:
        frame = ctx.report.study(view)
        if frame.is_empty():
            return None
        body = section(anchor, title, lead, *content(ctx, frame))
        return PageBody(body, [], {ctx.csv(f"{view}.csv"): frame_csv(frame)}, frame.height)
    return build


def _libraries(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = row_labels(frame, key="config", exclude=("variant", "blas", "onednn"))
    return [figure(sf.library_figure(frame, labels, ctx.levels), "fig-libraries"),
            ss.library_table(frame, labels, ctx.levels, csv_href=ctx.csv("library_comparison.csv"))]


def _threads(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = row_labels(frame, key="config", exclude=("threads",))
    parts: list[Any] = [figure(sf.thread_figure(frame, labels, ctx.levels), "fig-threads")]
    for i, (_, fig) in enumerate(sf.thread_batch_heatmaps(frame, limit=MAX_FIGURES)):
        parts.append(figure(fig, f"fig-threads-batch-{i}"))
    parts.append(ss.thread_table(frame, labels, ctx.levels, csv_href=ctx.csv("thread_sweep.csv")))
    return parts


def _note(text: Any) -> Any:
    return tag("p", text, class_="note") if text else ""


def _per_config(frame: pl.DataFrame, limit: int = MAX_FIGURES) -> tuple[list[pl.DataFrame], int]:
    parts = frame.partition_by("config", maintain_order=True)
    return parts[:limit], len(parts)


def _epochs(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = row_labels(frame, key="config", exclude=("epochs", "iterations", "unit"))
    shown, total = _per_config(frame)
    parts: list[Any] = [_note(ss.more_note(len(shown), total, "configurations"))]
    for i, part in enumerate(shown):
        for j, unit_part in enumerate(part.partition_by("unit", maintain_order=True)):
            label = labels.get(part.get_column("config")[0], "")
            parts.append(figure(sf.epoch_sweep_figure(unit_part, label, ctx.levels),
                                f"fig-epochs-{i}-{j}"))
    parts.append(ss.epoch_table(frame, labels, ctx.levels, csv_href=ctx.csv("epoch_sweep.csv")))
    return parts


def _batch_page(ctx: Context) -> PageBody | None:
    sweep, resources = ctx.report.study("batch_sweep"), ctx.report.study("batch_resources")
    if sweep.is_empty() and resources.is_empty():
        return None
    both = pl.concat([f for f in (sweep, resources) if not f.is_empty()], how="diagonal_relaxed")
    labels = row_labels(both, key="config", exclude=("batch_size",))
    parts: list[Any] = []
    csv: dict[str, str] = {}
    anchors: list[tuple[str, str]] = []
    if not sweep.is_empty():
        parts.append(section(
            "batch", "Batch size: speed, time and accuracy (A8; B2–B3)",
            "Throughput (training solid, inference dashed), seconds per epoch and test accuracy "
            "against the batch size, compared with the smallest batch. Batches where no run "
            "succeeded are marked × at zero.",
            figure(sf.batch_figure(sweep, labels, ctx.levels), "fig-batch"),
            ss.batch_table(sweep, labels, ctx.levels, csv_href=ctx.csv("batch_sweep.csv"))))
        csv[ctx.csv("batch_sweep.csv")] = frame_csv(sweep)
        anchors.append(("batch", "Speed and accuracy"))
    if not resources.is_empty():
        parts.append(section(
            "batch-resources", "Resources against the batch size (A11; B1)",
            "CPU % (percent of one core, summed over the cell's processes), host memory and "
            "device memory per batch size; a memory limit is dashed, batches that ran out of "
            "memory are marked ×.",
            figure(sf.batch_resources_figure(resources, labels), "fig-batch-resources"),
            ss.batch_resources_table(resources, labels, csv_href=ctx.csv("batch_resources.csv"))))
        csv[ctx.csv("batch_resources.csv")] = frame_csv(resources)
        anchors.append(("batch-resources", "Resources"))
    return PageBody(join(parts, "\n"), anchors, csv, max(sweep.height, resources.height))


def _lr_grid(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = row_labels(frame, key="config", exclude=("batch_size", "epochs", "iterations", "lr"))
    # A heatmap where the learning rate varies; a batch-only sweep is the Batch size page's.
    with_lrs = frame.filter(pl.col("lr").n_unique().over("config") > 1)
    shown, total = _per_config(with_lrs)
    parts: list[Any] = [_note(ss.more_note(len(shown), total, "configurations"))]
    if not total:
        parts.append(tag("p", "No configuration was run with two learning rates, so there is no "
                              "batch × learning rate grid to draw; the table lists the batch × "
                              "length cells.", class_="note"))
    for i, part in enumerate(shown):
        label = labels.get(part.get_column("config")[0], "")
        parts.append(figure(sf.lr_grid_figure(part, label), f"fig-lr-grid-{i}"))
    parts.append(ss.lr_grid_table(frame, labels, ctx.levels, csv_href=ctx.csv("batch_lr_grid.csv")))
    return parts


def _scaling(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = row_labels(frame, key="config", exclude=("gpus", "workers", "nodes", "batch_size"))
    return [figure(sf.scaling_figure(frame, labels), "fig-scaling"),
            ss.scaling_table(frame, labels, ctx.levels, csv_href=ctx.csv("worker_scaling.csv"))]


def _convergence(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = cell_label_map(ctx, frame)
    ranked = (frame.group_by("cell_id", maintain_order=True)
              .agg(pl.col("runs").max().alias("n"), pl.len().alias("epochs"))
              .sort(["n", "epochs"], descending=True, maintain_order=True))
    cells = ranked.get_column("cell_id").to_list()
    shown = frame.filter(pl.col("cell_id").is_in(cells[:MAX_CONVERGENCE_CELLS]))
    note = (f"The figure shows the {MAX_CONVERGENCE_CELLS} cells with the most repeats of "
            f"{len(cells)}; the table and its CSV have them all." if len(cells) > MAX_CONVERGENCE_CELLS else "")
    return [_note(note), figure(sf.convergence_figure(shown, labels), "fig-convergence"),
            ss.convergence_table(frame, labels, csv_href=ctx.csv("epoch_convergence.csv"))]


def _layers_page(ctx: Context) -> PageBody | None:
    layers, kinds = ctx.report.study("layer_breakdown"), ctx.report.study("layer_kinds")
    if layers.is_empty():
        return None
    labels = cell_label_map(ctx, layers)
    cells = layers.partition_by(["sweep", "cell_id"], maintain_order=True)
    parts: list[Any] = [figure(sf.layer_kinds_figure(kinds, labels), "fig-layer-kinds")]
    if len(cells) > MAX_FIGURES:
        parts.append(_note(ss.more_note(MAX_FIGURES, len(cells), "cells")))
    for i, part in enumerate(cells[:MAX_FIGURES]):
        parts.append(figure(sf.layer_figure(part, labels.get(part.get_column("cell_id")[0], "")),
                            f"fig-layers-{i}"))
    parts += [ss.layer_kinds_table(kinds, labels, csv_href=ctx.csv("layer_kinds.csv")),
              ss.layer_table(layers, labels, csv_href=ctx.csv("layer_breakdown.csv"))]
    body = section("layers", "Layer-wise forward and backward time (D Figs 6–7; E Fig 7)",
                   "Median over each cell's runs of every layer's isolated forward and backward "
                   "time (cells run with layer_profile), and the share of each kind of layer.",
                   *parts)
    csv = {ctx.csv("layer_kinds.csv"): frame_csv(kinds), ctx.csv("layer_breakdown.csv"): frame_csv(layers)}
    return PageBody(body, [], csv, layers.height)


def _iterations_page(ctx: Context) -> PageBody | None:
    model, scaling = ctx.report.study("iteration_model"), ctx.report.study("iteration_scaling")
    if model.is_empty():
        return None
    colors = sf.phase_colors(model)
    groups = model.partition_by(list(sf.PHASE_GROUP), maintain_order=True)
    parts: list[Any] = [_note(ss.more_note(min(MAX_FIGURES, len(groups)), len(groups), "configurations"))]
    for i, part in enumerate(groups[:MAX_FIGURES]):
        # Inside a configuration a bar is labelled by its framework and what else varies.
        inner = row_labels(part.drop("model", "dataset"), key="cell_id", exclude=sf.PHASE_GROUP)
        group = sf.phase_group_text(part.row(0, named=True))
        parts.append(figure(sf.phase_figure(part, inner, group, colors), f"fig-phases-{i}"))
    parts.append(ss.iteration_table(model, row_labels(model, key="cell_id"),
                                    csv_href=ctx.csv("iteration_model.csv")))
    body = [section("iterations", "Where the time goes (C)", _LEADS["iterations"], *parts)]
    anchors = [("iterations", "Phases"), ("iteration-scaling", "Predicted scaling")]
    csv = {ctx.csv("iteration_model.csv"): frame_csv(model)}
    if scaling.is_empty():
        anchors.pop()
    else:
        labels = row_labels(scaling, key="config", exclude=("gpus", "workers", "nodes", "batch_size"))
        body.append(section(
            "iteration-scaling", "Predicted against measured scaling (C; B, E)",
            _LEADS["iteration-scaling"],
            figure(sf.predicted_scaling_figure(scaling, labels), "fig-iteration-scaling"),
            ss.iteration_scaling_table(scaling, labels, csv_href=ctx.csv("iteration_scaling.csv"))))
        csv[ctx.csv("iteration_scaling.csv")] = frame_csv(scaling)
    return PageBody(join(body, "\n"), anchors, csv, model.height)


def _options(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = row_labels(frame, key="config", exclude=("layout", "precision", "onednn"))
    return [figure(sf.option_figure(frame, labels), "fig-options"),
            ss.option_table(frame, labels, csv_href=ctx.csv("option_effect.csv"))]


def _pareto(ctx: Context, frame: pl.DataFrame) -> list[Any]:
    labels = cell_label_map(ctx, frame, exclude=("model", "dataset", "device"))
    groups = frame.partition_by(["model", "dataset", "device"], maintain_order=True)
    parts: list[Any] = []
    if len(groups) > MAX_FIGURES:
        parts.append(_note(ss.more_note(MAX_FIGURES, len(groups), "groups")))
    for i, part in enumerate(groups[:MAX_FIGURES]):
        first = part.row(0, named=True)
        group = f"{first['model']} · {first['dataset']} · {first['device']}"
        parts.append(figure(sf.pareto_figure(part, labels, group), f"fig-pareto-{i}"))
    parts.append(ss.pareto_table(frame, labels, ctx.levels, csv_href=ctx.csv("pareto_front.csv")))
    return parts


def _releases_page(ctx: Context) -> PageBody | None:
    """The workloads measured at two or more releases (``matrun history``), a figure per
    framework; no page while every workload has one release."""
    result = ctx.report.history
    if result is None:
        return None
    shown = [p for points in result.workloads().values() if len(points) > 1 for p in points]
    if not shown:
        return None
    unit = hist.METRICS[result.metric].unit
    frameworks = list(dict.fromkeys(p["framework"] for p in shown))
    parts: list[Any] = [_note(ss.more_note(min(MAX_FIGURES, len(frameworks)), len(frameworks), "frameworks"))]
    for i, fw in enumerate(frameworks[:MAX_FIGURES]):
        parts.append(figure(figures.release_figure([p for p in shown if p["framework"] == fw], framework=fw,
                                                   metric=result.metric, unit=unit), f"fig-releases-{i}"))
    largest = hist.sentences(hist.History(result.metric, result.by, shown))
    if largest:
        parts.append(tag("ul", join(tag("li", line) for line in largest)))
    parts.append(sections.releases_table(shown, csv_href="releases.csv"))
    body = section(
        "releases", "Across framework releases",
        "Each workload (a cell without its release) at every framework release it was measured "
        "at: the release a run asked for (version), else the one its probe found in force. Per "
        "release the median throughput over its ok runs and the exact interval of the median; "
        "against the release before, the ratio of medians with its Hodges–Lehmann interval and "
        "the Mann–Whitney p, adjusted by Holm's method for the number of comparisons of the "
        "workload. A triangle marks a significant change (up: faster, down: slower).",
        *parts)
    csv = {"releases.csv": hist.to_csv(hist.History(result.metric, result.by, shown))}
    return PageBody(body, [], csv, len(shown))


def _provenance_page(ctx: Context) -> PageBody | None:
    report = ctx.report
    if report.provenance.is_empty():
        return None
    hosts, envs = hosts_summary(report.provenance), environments_summary(report.provenance)
    colors = list(ctx.colors)
    in_force = sorted(in_force_summary(report.provenance, report.runs),
                      key=lambda g: colors.index(g.label) if g.label in colors else len(colors))
    body = sections.provenance_section(hosts, envs, in_force, report.images, downloads=True)
    csv = {"hosts.csv": frame_csv(hosts), "environments.csv": frame_csv(envs),
           "in_force.csv": in_force_csv(in_force), "provenance.csv": frame_csv(report.provenance)}
    if not report.images.is_empty():
        csv["images.csv"] = frame_csv(report.images)
    return PageBody(body, [], csv, report.provenance.height)


def in_force_csv(groups: list[InForce]) -> str:
    return csv_text(
        ["sweep", "cell_id", "label", "runs", "asked_threads", "asked_onednn", "in_force",
         "libraries", "mismatches"],
        [[g.sweep, g.cell_id, g.label, g.runs, g.asked_threads, g.asked_onednn,
          json.dumps(g.in_force, sort_keys=True, default=str),
          json.dumps(g.libraries, sort_keys=True, default=str), json.dumps(g.mismatches)]
         for g in groups])


def _runs_page(ctx: Context) -> PageBody | None:
    report = ctx.report
    runs = report.runs
    if runs.is_empty():
        return None
    label_of = {(r["sweep"], r["cell_id"]): r["label"] for r in ctx.labels.iter_rows(named=True)}
    shown = monitor_runs(runs, report.selected_run, limit=MAX_MONITOR_RUNS)
    status_of = dict(zip(runs.get_column("run_id").to_list(), runs.get_column("status").to_list()))
    cell_of = {r["run_id"]: (r["sweep"], r["cell_id"]) for r in runs.iter_rows(named=True)}
    menu = [(rid, f"{rid} · {label_of.get(cell_of[rid], '')} · {status_of[rid]}") for rid in shown]
    monitor_fig = figures.monitor_figure(report.monitor, menu, report.selected_run or "")
    body = join([
        sections.monitor_section(figure(monitor_fig, "fig-monitor"), report.selected_run,
                                 len(shown), runs.height),
        sections.runs_section(runs, label_of, report.selected_run, csv_href="runs.csv"),
    ], "\n")
    return PageBody(body, [("monitor", "CPU & memory"), ("runs", "Runs")],
                    {"runs.csv": frame_csv(runs)}, runs.height)


_LEADS = {
    "libraries": "Each configuration run with two or more math libraries (the variant's BLAS "
                 "build, oneDNN on or off), against the framework's default library. Medians "
                 "with their confidence intervals as error bars.",
    "threads": "Each configuration run with two or more thread settings, against the fewest "
               "threads. Medians with their confidence intervals as error bars; ★ marks the "
               "fastest median of each configuration.",
    "epochs": "Each configuration run at two or more lengths: test accuracy (left axis) and "
              "training time (right axis), the dotted line the time if it grew exactly in "
              "proportion to the length.",
    "batch-lr": "Accuracy (median over ok runs) of every batch size × learning rate, one "
                "heatmap per training length. NaN: the loss diverged (the view's diverged).",
    "scaling": "Speedup of throughput over the 1-worker cell against the number of workers, "
               "with the linear limit y = x, and the efficiency (speedup ÷ workers).",
    "convergence": "Per cell and epoch over its ok runs: the median test accuracy with its "
                   "interval, the median seconds per epoch and the accuracy against elapsed time.",
    "options": "Each option against matrun's default value (heuristic, nchw, fp32, oneDNN on) in "
               "otherwise equal cells: the throughput ratio, coloured only when significant.",
    "pareto": "Median training time against median accuracy, with their intervals; the cells "
              "no other cell beats on both are the front (bold, joined).",
    "iterations": "Every Nth timed step of a cell (phase_sampling) is timed phase by phase: input, "
                  "host-to-device copy, forward, backward, gradient exchange, optimizer update; "
                  "those sampled steps are kept out of the throughput, since the clock and its "
                  "device waits slow them. One bar per cell: the median of each phase over its "
                  "sampled steps, stacked in the order they run, then what no phase accounts for "
                  "(drawn as zero when a little below it; the hover and the CSV keep the value). "
                  "A thin line marks the median sampled step, a diamond the median unsampled step "
                  "the throughput comes from. Phases a framework runs as one program are named "
                  "together (forward+backward+update) and hatched, never split. The model, what it "
                  "measures and what it assumes: docs/MODEL.md.",
    "iteration-scaling": "For each multi-worker cell whose 1-worker reference sampled its phases, "
                         "the speedup the model predicts (the reference's step less its own "
                         "exchange, plus the all-reduce this cell timed over a few message sizes: "
                         "latency + gradient bytes ÷ bandwidth, less what overlaps the backward "
                         "pass) against the measured one, with the linear limit y = workers. "
                         "Filled markers: measured; hollow, dotted: predicted; both start at the "
                         "reference (1 worker, ×1).",
}

BUILDERS: dict[str, Callable[[Context], PageBody | None]] = {
    "baseline.html": _baseline_page,
    "libraries.html": _study_page("library_comparison", "libraries", "Math libraries (A4–A5; D Fig 3)",
                                  _LEADS["libraries"], _libraries),
    "threads.html": _study_page("thread_sweep", "threads", "Threads (A6)", _LEADS["threads"], _threads),
    "epochs.html": _study_page("epoch_sweep", "epochs", "Training length (A7)", _LEADS["epochs"], _epochs),
    "batch.html": _batch_page,
    "batch-lr.html": _study_page("batch_lr_grid", "batch-lr",
                                 "Batch size × length × learning rate (A9–A10)", _LEADS["batch-lr"], _lr_grid),
    "scaling.html": _study_page("worker_scaling", "scaling", "Scaling over workers (A3; B4–B6; E)",
                                _LEADS["scaling"], _scaling),
    "convergence.html": _study_page("epoch_convergence", "convergence", "Convergence (B7)",
                                    _LEADS["convergence"], _convergence),
    "layers.html": _layers_page,
    "iterations.html": _iterations_page,
    "options.html": _study_page("option_effect", "options", "Framework options (E; D Fig 3)",
                                _LEADS["options"], _options),
    "pareto.html": _study_page("pareto_front", "pareto", "Training time against accuracy",
                               _LEADS["pareto"], _pareto),
    "releases.html": _releases_page,
    "provenance.html": _provenance_page,
    "runs.html": _runs_page,
}


# --- study pages ------------------------------------------------------------------------------

STUDY_FINDINGS_CSV = "findings.csv"
# The page of a study's view: the section page whose builder draws it, cut to its cells.
VIEW_PAGES: dict[str, str] = {
    "baseline": "baseline.html", "default_cells": "baseline.html", "best_vs_default": "baseline.html",
    "library_comparison": "libraries.html", "thread_sweep": "threads.html", "epoch_sweep": "epochs.html",
    "batch_sweep": "batch.html", "batch_resources": "batch.html", "batch_lr_grid": "batch-lr.html",
    "worker_scaling": "scaling.html", "epoch_convergence": "convergence.html",
    "layer_breakdown": "layers.html", "layer_kinds": "layers.html", "option_effect": "options.html",
    "pareto_front": "pareto.html", "iteration_model": "iterations.html", "iteration_scaling": "iterations.html",
}


def _cells_only(frame: pl.DataFrame, cells: list[str]) -> pl.DataFrame:
    if frame.is_empty() or "cell_id" not in frame.columns:
        return frame
    return frame.filter(pl.col("cell_id").is_in(cells))


def study_context(ctx: Context, info: sp.StudyInfo) -> Context:
    """The report narrowed to one study's cells, its CSV files named after the study: the
    section builders then draw the study's part of their view (its cells' rows and the rows
    of the reference cells they are compared with)."""
    report, cells = ctx.report, list(info.cells)
    narrowed = replace(
        report, runs=_cells_only(report.runs, cells), baseline=_cells_only(report.baseline, cells),
        epoch_curve=_cells_only(report.epoch_curve, cells),
        provenance=_cells_only(report.provenance, cells),
        studies={name: cut_to_cells(name, frame, cells) for name, frame in report.studies.items()})
    labels = cell_labels(narrowed.runs)
    base = _with_labels(narrowed.baseline, labels)
    colors = figures.cell_colors(
        [*base.get_column("label").to_list(), *labels.get_column("label").to_list()])
    return Context(report=narrowed, labels=labels, colors=colors, levels=ctx.levels,
                   csv_prefix=info.csv(""))


def _host_text(provenance: pl.DataFrame) -> str:
    """This host in a few words: CPU model and count (and how many setups, if several)."""
    if provenance.is_empty():
        return ""
    hosts = hosts_summary(provenance).to_dicts()
    first = hosts[0]
    count = "?" if first.get("cpu_count") is None else first["cpu_count"]
    text = f"{first.get('cpu_model') or 'an unknown CPU'}, {count} CPUs"
    return text + (f" (and {len(hosts) - 1} other host setup(s))" if len(hosts) > 1 else "")


def _present_findings(ctx: Context, studies: list[sp.StudyInfo]) -> pl.DataFrame:
    frames = [sp.study_findings(ctx.report.catalogue.findings, info.id) for info in studies]
    frames = [f for f in frames if not f.is_empty()]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def _catalogue_page(ctx: Context, info: sp.StudyInfo) -> PageBody:
    """A study's page: its verdicts, the paper's table beside this host's, its view's tables."""
    catalogue = ctx.report.catalogue
    sub = study_context(ctx, info)
    csv: dict[str, str] = {}
    anchors = [("verdicts", "Verdicts")]
    findings = sp.study_findings(catalogue.findings, info.id)
    if not findings.is_empty():
        verdicts: Any = sp.verdict_table(findings, csv_href=info.csv("findings.csv"))
        csv[info.csv("findings.csv")] = sp.findings_csv(findings)
    else:
        declared = sp.declared_findings(catalogue.findings_declared, info.id)
        verdicts = sp.declared_table(declared) if not declared.is_empty() else \
            tag("p", "This study declares no finding.", class_="note")
    parts: list[Any] = [section("verdicts", f"Study {info.id}: {info.title}", sp.study_lead(info),
                                verdicts)]
    paper = info.paper
    if paper is not None:
        prows = sp.paper_rows(paper)
        hrows = sp.host_rows(sp.cells_of(ctx.report.cell_levels, info.cells), paper,
                             x=paper.x, metric=paper.metric)
        content: list[Any] = [sp.hardware_banner(paper, _host_text(sub.report.provenance))]
        shapes = sp.shapes_table(paper, prows, hrows, csv_href=info.csv("shapes.csv"))
        if shapes is not None:
            content.append(shapes)
            csv[info.csv("shapes.csv")] = sp.shapes_csv(paper, prows, hrows)
        fig = sp.ratio_figure(paper, prows, hrows)
        if fig is not None:
            content.append(figure(fig, "fig-paper-ratios"))
        content += [sp.paper_table(paper, prows, csv_href=info.csv("paper.csv")),
                    sp.host_table(paper, hrows, csv_href=info.csv("host.csv"))]
        csv[info.csv("paper.csv")] = sp.paper_csv(paper, prows)
        csv[info.csv("host.csv")] = sp.host_csv(paper, hrows)
        parts.append(section(
            "paper", f"The paper's {paper.source or 'table'} beside this host",
            "The paper's numbers as transcribed from the seed and this host's medians for the same "
            "rows, matched on the paper's x, each divided by the first row of its series: first "
            "side by side and drawn, then each table whole.",
            *content))
        anchors.append(("paper", "Paper vs this host"))
    page = VIEW_PAGES.get(info.view or "", "baseline.html")
    host = BUILDERS[page](sub) or (BUILDERS["baseline.html"](sub) if page != "baseline.html" else None)
    if host is not None:
        parts.append(tag("div", host.body, id="host"))
        csv.update(host.csv)
        anchors.append(("host", "This host's data"))
    else:
        parts.append(section("host", "This host's data", "",
                             tag("p", "No cell of this study has a successful run yet; see Runs.",
                                 class_="banner warn")))
    return PageBody(join(parts, "\n"), anchors, csv, findings.height)


# --- the site --------------------------------------------------------------------------------


def render_site(report: ReportData, *, sweep: str | None = None, source: str = "",
                generated: datetime | None = None) -> dict[str, str]:
    """Every file of the site but the assets: relative path -> text."""
    title = f"matrun report — {sweep}" if sweep else "matrun report"
    runs = report.runs
    if runs.is_empty():
        page = render_page(title=title, subtitle=Html("no runs yet"), nav=[],
                           body=sections.empty_section(sweep), generated=generated)
        return {INDEX: page}
    labels = cell_labels(runs)
    baseline = _with_labels(report.baseline, labels)
    # Colours (and the order of lines) follow the baseline table, then cells without results.
    colors = figures.cell_colors(
        [*baseline.get_column("label").to_list(), *labels.get_column("label").to_list()])
    levels = {r["cell_id"]: r for r in report.cell_levels.iter_rows(named=True)} \
        if not report.cell_levels.is_empty() else {}
    ctx = Context(report=report, labels=labels, colors=colors, levels=levels)
    built = [(spec, BUILDERS[spec.file](ctx)) for spec in PAGES]
    present = [(spec, body) for spec, body in built if body is not None]
    studies = sp.present_studies(report.catalogue.studies, report.catalogue.cells,
                                 runs.get_column("cell_id").to_list())
    study_pages = [(info, _catalogue_page(ctx, info)) for info in studies]
    tunings = tp.pages_of(report.tunings)
    site_nav = [(INDEX, "Overview"), *[(info.file, info.id) for info in studies],
                *[(spec.file, spec.nav) for spec, _ in present],
                *[(tp.page_file(t["tuning"]), f"tune {t['tuning'][:8]}") for t in tunings]]
    scope = f"sweep {sweep}" if sweep else (
        f"sweep {report.sweeps[0]}" if len(report.sweeps) == 1
        else f"{len(report.sweeps)} sweeps: {', '.join(report.sweeps)}")
    subtitle = join([scope, f" · {labels.height} cells · {runs.height} runs",
                     f" · warehouse {source}" if source else ""])
    files: dict[str, str] = {}
    for spec, body in present:
        files[spec.file] = render_page(
            title=f"{spec.title} — {title}", subtitle=subtitle, nav=body.anchors, body=body.body,
            generated=generated, site_nav=site_nav, current=spec.file)
        files.update(body.csv)
    for info, body in study_pages:
        files[info.file] = render_page(
            title=f"Study {info.id}: {info.title} — {title}", subtitle=subtitle, nav=body.anchors,
            body=body.body, generated=generated, site_nav=site_nav, current=info.file)
        files.update(body.csv)
    for t in tunings:
        body, anchors, csv = tp.tuning_body(t)
        files[tp.page_file(t["tuning"])] = render_page(
            title=f"Tuning {t['tuning']} — {title}", subtitle=subtitle, nav=anchors, body=body,
            generated=generated, site_nav=site_nav, current=tp.page_file(t["tuning"]))
        files.update(csv)
    index_body = _index_body(ctx, present, labels, studies)
    if studies:
        files[STUDY_FINDINGS_CSV] = sp.findings_csv(_present_findings(ctx, studies))
    files[INDEX] = render_page(title=title, subtitle=subtitle, nav=[], body=index_body,
                               generated=generated, site_nav=site_nav, current=INDEX)
    return files


def _index_body(ctx: Context, present: list[tuple[PageSpec, PageBody]], labels: pl.DataFrame,
                studies: list[sp.StudyInfo]) -> Html:
    report = ctx.report
    runs = report.runs
    parts: list[Any] = []
    if studies:
        parts.append(section(
            "studies", "The studies: does the paper's finding hold on this host?",
            "Every finding of every study with runs in this report, as the warehouse's findings "
            "view judges it here: 'reproduced' (green) and 'contradicted' (red) only when the "
            "Mann–Whitney test finds the difference significant (p < 0.05). Each study's page "
            "has the numbers, the paper's own table beside this host's, and its figures.",
            sp.index_verdict_table(studies, report.catalogue.findings, csv_href=STUDY_FINDINGS_CSV)))
    parts.append(sections.summary_cards(runs, report.baseline))
    hosts = hosts_summary(report.provenance) if not report.provenance.is_empty() else None
    if hosts is not None and hosts.height > 1:
        parts.append(tag("p", f"⚠ These runs come from {hosts.height} different host setups: "
                              "compare times across them with care (see Provenance).",
                         class_="banner warn"))
    if report.baseline.is_empty():
        parts.append(tag("p", "No cell has a successful run yet; see Runs for their errors.",
                         class_="banner warn"))
        label_of = {(r["sweep"], r["cell_id"]): r["label"] for r in labels.iter_rows(named=True)}
        unfinished = unfinished_cells(runs, report.baseline, label_of)
        parts.append(tag("ul", join(tag("li", join([tag("b", label), " — ", statuses]))
                                    for label, statuses in unfinished)))
    tiles = []
    for spec, body in present:
        tiles.append(tag("a", join([
            tag("b", spec.title),
            tag("span", spec.about, class_="sub"),
            tag("span", f"{body.rows:,} row(s) · CSV: {', '.join(sorted(body.csv))}", class_="sub"),
        ]), href=spec.file, class_="tile"))
    parts.append(section(
        "pages", "What this report shows",
        "One page per question the data can answer; a page appears only when its view has rows. "
        "Medians come with their confidence interval (below six runs only the [min, max] range, "
        "with its true coverage); a comparison is called faster or slower only when a two-sided "
        "Mann–Whitney test finds it significant (p < 0.05), otherwise 'not significant'. Every "
        "table can be downloaded as CSV.",
        tag("nav", join(tiles), class_="pagelist")))
    return join(parts, "\n")


def unfinished_cells(
    runs: pl.DataFrame, baseline: pl.DataFrame, label_of: Mapping[tuple[str, str], str]
) -> list[tuple[str, str]]:
    """(label, status counts) of cells that have runs but no row in the baseline."""
    done = set(zip(baseline.get_column("sweep").to_list(), baseline.get_column("cell_id").to_list())) \
        if not baseline.is_empty() else set()
    counts: dict[tuple[str, str], Counter[str]] = {}
    for r in runs.iter_rows(named=True):
        key = (r["sweep"], r["cell_id"])
        if key not in done:
            counts.setdefault(key, Counter())[str(r["status"])] += 1
    return [
        (label_of.get(key, key[1]), ", ".join(f"{s} ×{n}" for s, n in sorted(c.items())))
        for key, c in counts.items()
    ]
