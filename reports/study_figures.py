"""Figures of the study pages: a study view's rows in, Plotly figures out.  No I/O.

Each builder takes the rows of one view (docs/WAREHOUSE.md, "Views that answer the
studies") and the labels of its configurations or cells (``shape.row_labels``).  Medians
carry error bars from the view's ``*_ci_low`` / ``*_ci_high``; the hover says what the bar
is (a 95 % confidence interval, or only the [min, max] range below six runs, and its true
coverage) and gives the comparison's verdict as the view words it, so a difference that is
not significant never reads as a win.  Every text from the data goes through ``plot_text``.
"""

from __future__ import annotations

import math
from graphlib import CycleError, TopologicalSorter
from typing import Any, Mapping, Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from matrun.reports.figures import PALETTE, base_layout, empty_figure, legend_below, plot_text
from matrun.reports.shape import thread_order, thread_text

# Colours of the verdicts, in bars and badges alike.
SIGNIFICANT_BETTER = "#1a7f37"
SIGNIFICANT_WORSE = "#b42318"
NOT_SIGNIFICANT = "#8c95a6"
REFERENCE = "#15233b"


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def _bars(median: Sequence[Any], low: Sequence[Any], high: Sequence[Any]) -> dict[str, Any]:
    """Asymmetric error bars from an interval around each median (none where unknown)."""
    plus = [(_num(h) - _num(m)) if _num(h) is not None and _num(m) is not None else 0.0
            for m, h in zip(median, high)]
    minus = [(_num(m) - _num(lo)) if _num(lo) is not None and _num(m) is not None else 0.0
             for m, lo in zip(median, low)]
    return {"type": "data", "symmetric": False, "array": [max(0.0, v) for v in plus],
            "arrayminus": [max(0.0, v) for v in minus], "thickness": 1.3, "width": 4}


def interval_text(low: Any, high: Any, level: Any = None, n: Any = None, digits: int = 1,
                  percent: bool = False) -> str:
    """What an error bar is, in words: a 95 % CI, or a [min, max] range and its coverage."""
    def show(v: Any) -> str:
        return f"{100 * v:.{digits}f}%" if percent else f"{v:,.{digits}f}"

    if _num(low) is None or _num(high) is None:
        return "no interval (one run)" if n in (None, 1) else "no interval"
    span = f"{show(low)}–{show(high)}"
    if level is None:
        return f"interval {span}"
    if level >= 0.95:
        return f"{100 * level:.1f}% CI {span}"
    runs = f"n={n}, " if n else ""
    return f"range {span} ({runs}{100 * level:.1f}% coverage)"


def verdict_text(verdict: Any, p_value: Any = None, test: Any = None) -> str:
    """The view's verdict with its p-value and test, for a hover or a bar's text."""
    if verdict is None:
        return "no comparison"
    if verdict == "reference":
        return "reference"
    p = f"p = {p_value:.3g}" if _num(p_value) is not None else ""
    how = f"{test}" if test else ""
    extra = ", ".join(x for x in (p, how) if x)
    return f"{verdict} ({extra})" if extra else str(verdict)


def _verdict_color(verdict: Any, significant: Any) -> str:
    if verdict == "reference":
        return REFERENCE
    if significant and verdict in ("faster", "more accurate"):
        return SIGNIFICANT_BETTER
    if significant and verdict in ("slower", "less accurate"):
        return SIGNIFICANT_WORSE
    return NOT_SIGNIFICANT


def _levels(levels: Mapping[str, Mapping[str, Any]], cell_id: Any, stat: str) -> tuple[Any, Any]:
    row = levels.get(cell_id, {})
    return row.get(f"{stat}_ci_level"), row.get(f"{stat}_n")


def _hover(rows: Sequence[Mapping[str, Any]], levels: Mapping[str, Mapping[str, Any]],
           stat: str, median: str, *, digits: int = 1, percent: bool = False,
           extra: Sequence[str] = ()) -> list[str]:
    """Per row a plot_text'ed line: the interval of ``stat`` and extra columns' words."""
    out = []
    for r in rows:
        level, n = _levels(levels, r.get("cell_id"), stat)
        parts = [interval_text(r.get(f"{median}_ci_low"), r.get(f"{median}_ci_high"), level, n,
                               digits, percent)]
        parts += [str(r[c]) for c in extra if r.get(c) is not None]
        out.append(plot_text(" · ".join(parts)))
    return out


# --- A1: framework defaults and best settings --------------------------------------------


def defaults_figure(default_cells: pl.DataFrame) -> go.Figure:
    """Grouped bars per (model, dataset, device, mode): each framework's default cell's
    median train s, test s and accuracy, error bars from their confidence intervals."""
    title = "Each framework at its own default settings (A1: medians, bars: CI)"
    rows = default_cells.filter(pl.col("cell_id").is_not_null())
    if rows.is_empty():
        return empty_figure(title, "No group has exactly one cell with the framework's default settings.")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=("Training seconds", "Test seconds", "Test accuracy"))
    frameworks = list(dict.fromkeys(rows.get_column("framework").to_list()))
    for i, fw in enumerate(frameworks):
        part = rows.filter(pl.col("framework") == fw).to_dicts()
        x = [plot_text(f"{r['model']} · {r['dataset']} · {r['device']} · {r['mode']}") for r in part]
        common = {"name": plot_text(fw), "legendgroup": plot_text(fw), "marker": {"color": _color(i)},
                  "customdata": [[r["runs"]] for r in part]}
        for col, (stat, fmt) in enumerate((("train_s", ".2f"), ("test_s", ".2f"),
                                            ("accuracy", ".2%")), start=1):
            median = [r[f"{stat}_median"] for r in part]
            low = [r.get(f"{stat}_ci_low") for r in part]
            high = [r.get(f"{stat}_ci_high") for r in part]
            fig.add_trace(go.Bar(
                x=x, y=median, error_y=_bars(median, low, high) if stat != "test_s" else None,
                showlegend=col == 1, **common,
                hovertemplate=f"<b>%{{fullData.name}}</b><br>%{{x}}<br>median %{{y:{fmt}}}"
                              "<br>%{customdata[0]} runs<extra></extra>",
            ), row=1, col=col)
    fig.update_layout(barmode="group")
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(tickformat=".0%", row=1, col=3)
    return legend_below(fig, title)


def best_figure(best: pl.DataFrame) -> go.Figure:
    """Per (framework, model, dataset, device): default vs best cell's median throughput;
    the best bar is green only when the test says it is significantly faster."""
    title = "Best settings against the defaults (median images/s; colour: significance)"
    rows = best.filter(pl.col("best_cell_id").is_not_null()).to_dicts()
    if not rows:
        return empty_figure(title, "No group has a default cell to compare with.")
    x = [plot_text(f"{r['framework']} · {r['model']} · {r['dataset']} · {r['device']}") for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=x, y=[r["default_throughput"] for r in rows], name="default", marker={"color": REFERENCE},
        hovertemplate="%{x}<br>default: %{y:,.1f} images/s<extra></extra>",
    ))
    words = [plot_text(verdict_text(r["verdict"], r.get("p_value"), r.get("test"))) for r in rows]
    fig.add_trace(go.Bar(
        x=x, y=[r["best_throughput"] for r in rows], name="best",
        marker={"color": [_verdict_color(r["verdict"], r["significant"]) for r in rows]},
        text=[plot_text(f"×{r['speedup']:.2f} · {r['verdict']}") if _num(r.get("speedup")) else ""
              for r in rows],
        textposition="outside", customdata=[[w] for w in words],
        hovertemplate="%{x}<br>best: %{y:,.1f} images/s<br>%{customdata[0]}<extra></extra>",
    ))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="images / second", rangemode="tozero")
    return legend_below(fig, title)


# --- A4-A5: math libraries ------------------------------------------------------------------


def _library(r: Mapping[str, Any]) -> str:
    onednn = {True: "oneDNN on", False: "oneDNN off"}.get(r.get("onednn"), "oneDNN ?")
    blas = r.get("blas") or "?"
    return f"{r.get('variant')} ({blas}) · {onednn}"


def library_figure(frame: pl.DataFrame, labels: Mapping[Any, str],
                   levels: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Grouped bars per configuration, one bar per library: median throughput and train s
    with their intervals; the hover gives the verdict against the default library."""
    title = "Math libraries: throughput and training time per configuration (medians, bars: CI)"
    if frame.is_empty():
        return empty_figure(title, "No configuration ran with two libraries.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("Throughput (images/s, higher is better)",
                                        "Training seconds (lower is better)"))
    rows = frame.to_dicts()
    libraries = list(dict.fromkeys(_library(r) for r in rows))
    for i, lib in enumerate(libraries):
        part = [r for r in rows if _library(r) == lib]
        x = [plot_text(labels.get(r["config"], r["config"])) for r in part]
        words = [plot_text(verdict_text(r.get("verdict"), r.get("p_value"), r.get("test"))) for r in part]
        for col, (stat, median) in enumerate((("throughput", "throughput"), ("train_s", "train_s")), 1):
            med = [r[f"{median}_median"] for r in part]
            fig.add_trace(go.Bar(
                x=x, y=med, name=plot_text(lib), legendgroup=plot_text(lib), showlegend=col == 1,
                marker={"color": _color(i)},
                error_y=_bars(med, [r[f"{median}_ci_low"] for r in part],
                              [r[f"{median}_ci_high"] for r in part]),
                customdata=list(zip(_hover(part, levels, stat, median), words)),
                hovertemplate="<b>%{fullData.name}</b><br>%{x}<br>median %{y:,.2f}<br>"
                              "%{customdata[0]}<br>%{customdata[1]}<extra></extra>",
            ), row=1, col=col)
    fig.update_layout(barmode="group")
    fig.update_yaxes(rangemode="tozero")
    return legend_below(fig, title)


# --- A6: threads --------------------------------------------------------------------------


def thread_figure(frame: pl.DataFrame, labels: Mapping[Any, str],
                  levels: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Throughput and training time against the thread setting, one line per configuration,
    error bars from the intervals; the fastest setting of each configuration is a star."""
    title = "Threads: throughput and training time (medians, bars: CI; ★ fastest)"
    if frame.is_empty():
        return empty_figure(title, "No configuration ran with two thread settings.")
    order = thread_order(frame.get_column("threads").to_list())
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("Throughput (images/s)", "Training seconds"))
    for i, config in enumerate(dict.fromkeys(frame.get_column("config").to_list())):
        part = sorted(frame.filter(pl.col("config") == config).to_dicts(),
                      key=lambda r: order.index(thread_text(r["threads"])))
        name = plot_text(labels.get(config, config))
        x = [plot_text(thread_text(r["threads"])) for r in part]
        words = [plot_text(verdict_text(r.get("verdict"), r.get("p_value"), r.get("test")) +
                           (" · noisy" if r.get("throughput_noisy") else "")) for r in part]
        for col, stat in enumerate(("throughput", "train_s"), 1):
            med = [r[f"{stat}_median"] for r in part]
            fig.add_trace(go.Scatter(
                x=x, y=med, name=name, legendgroup=name, showlegend=col == 1, mode="lines+markers",
                line={"color": _color(i)},
                marker={"color": _color(i), "size": [14 if r["fastest"] else 7 for r in part],
                        "symbol": ["star" if r["fastest"] else "circle" for r in part]},
                error_y=_bars(med, [r[f"{stat}_ci_low"] for r in part],
                              [r[f"{stat}_ci_high"] for r in part]),
                customdata=list(zip(_hover(part, levels, stat, stat), words)),
                hovertemplate="<b>%{fullData.name}</b><br>threads %{x}: %{y:,.2f}<br>"
                              "%{customdata[0]}<br>%{customdata[1]}<extra></extra>",
            ), row=1, col=col)
    fig.update_xaxes(type="category", categoryorder="array",
                     categoryarray=[plot_text(t) for t in order], title_text="threads")
    fig.update_yaxes(rangemode="tozero")
    return legend_below(fig, title)


# Columns that define a threads x batch grid: a thread_sweep configuration less batch_size.
_GRID_KEYS = ("framework", "variant", "model", "dataset", "device", "mode", "onednn", "epochs")


def thread_batch_heatmaps(frame: pl.DataFrame, limit: int = 6) -> list[tuple[str, go.Figure]]:
    """Median throughput over threads x batch size, one heatmap per setting that ran at
    least two of each (A6 x A8); returns (plain title, figure) pairs."""
    if frame.is_empty():
        return []
    keys = [k for k in _GRID_KEYS if k in frame.columns]
    out: list[tuple[str, go.Figure]] = []
    for group in frame.partition_by(keys, maintain_order=True):
        batches = sorted({b for b in group.get_column("batch_size").to_list() if b is not None})
        threads = thread_order(group.get_column("threads").to_list())
        if len(batches) < 2 or len(threads) < 2:
            continue
        first = group.row(0, named=True)
        name = " · ".join(str(first[k]) for k in ("framework", "model", "dataset", "device", "mode"))
        z: list[list[float | None]] = [[None] * len(threads) for _ in batches]
        for r in group.iter_rows(named=True):
            if r["batch_size"] in batches:
                z[batches.index(r["batch_size"])][threads.index(thread_text(r["threads"]))] = r["throughput_median"]
        fig = go.Figure(go.Heatmap(
            x=[plot_text(t) for t in threads], y=[str(b) for b in batches], z=z, colorscale="Viridis",
            colorbar={"title": {"text": "images/s"}}, hoverongaps=False,
            texttemplate="%{z:,.0f}",
            hovertemplate="threads %{x} · batch %{y}<br>median %{z:,.1f} images/s<extra></extra>",
        ))
        fig.update_xaxes(type="category", title_text="threads")
        fig.update_yaxes(type="category", title_text="batch size")
        title = f"Threads × batch size: median throughput — {name}"
        out.append((title, base_layout(fig, title=plot_text(title), height=380)))
        if len(out) >= limit:
            break
    return out


# --- A7: epochs -------------------------------------------------------------------------------


def epoch_sweep_figure(part: pl.DataFrame, label: str,
                       levels: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """One configuration: accuracy (left axis) and training time (right axis) against the
    length, both medians with intervals, and the time a strictly proportional growth from
    the shortest length would take (dotted)."""
    rows = part.sort("length").to_dicts()
    unit = rows[0]["unit"] if rows else "epochs"
    title = f"Accuracy and training time vs {unit} — {label}"
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [r["length"] for r in rows]
    acc = [r["accuracy_median"] for r in rows]
    words = [plot_text(verdict_text(r.get("accuracy_verdict"), r.get("accuracy_p_value"),
                                    r.get("accuracy_test"))) for r in rows]
    fig.add_trace(go.Scatter(
        x=x, y=acc, name="test accuracy", mode="lines+markers", line={"color": _color(0)},
        error_y=_bars(acc, [r["accuracy_ci_low"] for r in rows], [r["accuracy_ci_high"] for r in rows]),
        customdata=list(zip(_hover(rows, levels, "accuracy", "accuracy", digits=2, percent=True), words)),
        hovertemplate=f"{unit} %{{x}}: accuracy %{{y:.2%}}<br>%{{customdata[0]}}<br>"
                      "%{customdata[1]}<extra></extra>",
    ), secondary_y=False)
    secs = [r["train_s_median"] for r in rows]
    fig.add_trace(go.Scatter(
        x=x, y=secs, name="training seconds", mode="lines+markers",
        line={"color": _color(1)}, marker={"symbol": "square"},
        error_y=_bars(secs, [r["train_s_ci_low"] for r in rows], [r["train_s_ci_high"] for r in rows]),
        customdata=[[plot_text(f"time ratio {r['time_ratio']:.2f} for length ratio "
                               f"{r['length_ratio']:.2f} (linearity {r['time_linearity']:.2f})")
                     if _num(r.get("time_linearity")) is not None else "no reference"]
                    for r in rows],
        hovertemplate=f"{unit} %{{x}}: %{{y:,.2f}} s<br>%{{customdata[0]}}<extra></extra>",
    ), secondary_y=True)
    ref = next((r for r in rows if r["cell_id"] == r.get("ref_cell_id")), None)
    if ref is not None and _num(ref["train_s_median"]) and ref["length"]:
        fig.add_trace(go.Scatter(
            x=x, y=[ref["train_s_median"] * r["length"] / ref["length"] for r in rows],
            name="proportional to the length", mode="lines",
            line={"color": _color(1), "dash": "dot", "width": 1},
            hovertemplate=f"proportional: %{{y:,.2f}} s at {unit} %{{x}}<extra></extra>",
        ), secondary_y=True)
    fig.update_xaxes(title_text=unit)
    fig.update_yaxes(title_text="test accuracy", tickformat=".0%", secondary_y=False)
    fig.update_yaxes(title_text="training seconds", rangemode="tozero", secondary_y=True)
    return legend_below(fig, plot_text(title), plot_height=280)


# --- A8 / B2 / B3 / A11 / B1: batch size ---------------------------------------------------


def _log2_axis(values: Sequence[Any]) -> dict[str, Any]:
    ticks = sorted({v for v in values if v})
    return {"type": "log", "tickvals": ticks, "ticktext": [str(t) for t in ticks],
            "title_text": "batch size (log scale)"}


def batch_figure(frame: pl.DataFrame, labels: Mapping[Any, str],
                 levels: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Training throughput (B3), inference throughput (B2, when there is any), seconds per
    epoch and accuracy (A8) against the batch size, one line per configuration, medians with
    their intervals; a batch where no run succeeded is marked × at zero."""
    title = "Batch size: throughput, time per epoch and accuracy (medians, bars: CI)"
    if frame.is_empty():
        return empty_figure(title, "No configuration ran with two batch sizes.")
    inference = (frame.get_column("mode") == "inference").any()
    titles = ["Training throughput (images/s)"]
    if inference:
        titles.append("Inference throughput (images/s)")
    titles += ["Seconds per epoch (training)", "Test accuracy (training)"]
    fig = make_subplots(rows=1, cols=len(titles), horizontal_spacing=0.06, subplot_titles=titles)
    epoch_col, acc_col = len(titles) - 1, len(titles)
    for i, config in enumerate(dict.fromkeys(frame.get_column("config").to_list())):
        part = frame.filter(pl.col("config") == config).sort("batch_size").to_dicts()
        ok = [r for r in part if r["runs"]]
        name = plot_text(labels.get(config, config))
        col = 2 if part[0].get("mode") == "inference" else 1
        line = {"color": _color(i)}
        words = [plot_text(verdict_text(r.get("verdict"), r.get("p_value"), r.get("test"))) for r in ok]
        med = [r["throughput_median"] for r in ok]
        fig.add_trace(go.Scatter(
            x=[r["batch_size"] for r in ok], y=med, name=name, legendgroup=name,
            mode="lines+markers", line=line,
            error_y=_bars(med, [r["throughput_ci_low"] for r in ok], [r["throughput_ci_high"] for r in ok]),
            customdata=list(zip(_hover(ok, levels, "throughput", "throughput"), words)),
            hovertemplate="<b>%{fullData.name}</b><br>batch %{x}: %{y:,.1f} images/s<br>"
                          "%{customdata[0]}<br>%{customdata[1]}<extra></extra>",
        ), row=1, col=col)
        failed = [r for r in part if not r["runs"]]
        if failed:
            fig.add_trace(go.Scatter(
                x=[r["batch_size"] for r in failed], y=[0] * len(failed), mode="markers",
                name=name, legendgroup=name, showlegend=False,
                marker={"symbol": "x", "size": 12, "color": SIGNIFICANT_WORSE},
                customdata=[[r["oom_runs"], r["failed_runs"]] for r in failed],
                hovertemplate="<b>%{fullData.name}</b><br>batch %{x}: no successful run "
                              "(%{customdata[0]} out of memory, %{customdata[1]} failed)<extra></extra>",
            ), row=1, col=col)
        train = [r for r in ok if r.get("mode") != "inference"]
        if not train:
            continue
        fig.add_trace(go.Scatter(
            x=[r["batch_size"] for r in train], y=[r["epoch_s_median"] for r in train],
            name=name, legendgroup=name, showlegend=False, mode="lines+markers", line=line,
            hovertemplate="<b>%{fullData.name}</b><br>batch %{x}: %{y:,.2f} s per epoch<extra></extra>",
        ), row=1, col=epoch_col)
        acc = [r["accuracy_median"] for r in train]
        fig.add_trace(go.Scatter(
            x=[r["batch_size"] for r in train], y=acc, name=name, legendgroup=name,
            showlegend=False, mode="lines+markers", line=line,
            error_y=_bars(acc, [r["accuracy_ci_low"] for r in train],
                          [r["accuracy_ci_high"] for r in train]),
            customdata=[[w] for w in _hover(train, levels, "accuracy", "accuracy", digits=2,
                                            percent=True, extra=("accuracy_verdict",))],
            hovertemplate="<b>%{fullData.name}</b><br>batch %{x}: %{y:.2%}<br>"
                          "%{customdata[0]}<extra></extra>",
        ), row=1, col=acc_col)
    for col in range(1, len(titles) + 1):
        fig.update_xaxes(**_log2_axis(frame.get_column("batch_size").to_list()), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_yaxes(tickformat=".0%", rangemode="normal", row=1, col=acc_col)
    return legend_below(fig, title)


def batch_resources_figure(frame: pl.DataFrame, labels: Mapping[Any, str]) -> go.Figure:
    """CPU use, host memory and device memory against the batch size (A11, B1), with the
    memory limit dashed and the batches that ran out of memory marked ×."""
    title = "Batch size: CPU %, host memory and device memory"
    if frame.is_empty():
        return empty_figure(title, "No configuration ran with two batch sizes.")
    has_device = frame.get_column("device_memory_peak_mb").drop_nulls().len() > 0
    titles = ["CPU % of one core (dotted: iowait)", "Host memory MiB (peak; dotted: average)"]
    if has_device:
        titles.append("Device memory MiB (peak)")
    fig = make_subplots(rows=1, cols=len(titles), horizontal_spacing=0.07, subplot_titles=titles)
    for i, config in enumerate(dict.fromkeys(frame.get_column("config").to_list())):
        part = frame.filter(pl.col("config") == config).sort("batch_size").to_dicts()
        ok = [r for r in part if r["runs"]]
        name = plot_text(labels.get(config, config))
        x = [r["batch_size"] for r in ok]
        line = {"color": _color(i)}
        series = [
            (1, "cpu_total_median", "CPU %{y:.0f}%", {}),
            (1, "iowait_median", "iowait %{y:.1f}%", {"dash": "dot", "width": 1}),
            (2, "rss_peak_mb", "peak %{y:,.1f} MiB", {}),
            (2, "rss_avg_mb", "average %{y:,.1f} MiB", {"dash": "dot", "width": 1}),
        ]
        if has_device:
            series.append((3, "device_memory_peak_mb", "device peak %{y:,.1f} MiB", {}))
        for k, (col, column, hover, style) in enumerate(series):
            fig.add_trace(go.Scatter(
                x=x, y=[r[column] for r in ok], name=name, legendgroup=name, showlegend=k == 0,
                mode="lines+markers", line={**line, **style},
                hovertemplate=f"<b>%{{fullData.name}}</b><br>batch %{{x}}: {hover}<extra></extra>",
            ), row=1, col=col)
        limit = next((r["memory_limit_mb"] for r in part if _num(r.get("memory_limit_mb"))), None)
        if limit is not None:
            fig.add_trace(go.Scatter(
                x=[min(r["batch_size"] for r in part), max(r["batch_size"] for r in part)],
                y=[limit, limit], name=name, legendgroup=name, showlegend=False, mode="lines",
                line={**line, "dash": "dash", "width": 1},
                hovertemplate=f"memory limit {limit:,.0f} MiB<extra></extra>",
            ), row=1, col=2)
        out = [r for r in part if r["oom_runs"]]
        if out:
            top = limit if limit is not None else max((r["rss_peak_mb"] or 0) for r in part)
            fig.add_trace(go.Scatter(
                x=[r["batch_size"] for r in out], y=[top] * len(out), mode="markers",
                name=name, legendgroup=name, showlegend=False,
                marker={"symbol": "x", "size": 12, "color": SIGNIFICANT_WORSE},
                customdata=[[r["oom_runs"]] for r in out],
                hovertemplate="batch %{x}: %{customdata[0]} run(s) out of memory<extra></extra>",
            ), row=1, col=2)
    for col in range(1, len(titles) + 1):
        fig.update_xaxes(**_log2_axis(frame.get_column("batch_size").to_list()), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    return legend_below(fig, title)


# --- A9-A10: batch x length x learning rate ------------------------------------------------


def lr_grid_figure(part: pl.DataFrame, label: str) -> go.Figure:
    """One configuration: median accuracy over batch size x learning rate, one heatmap per
    training length; a diverged cell is marked "NaN" (its loss went NaN or infinite)."""
    rows = part.to_dicts()
    lengths = sorted({(r["epochs"] or 0, r["iterations"] or 0) for r in rows})[:4]
    names = [f"{it} iteration(s)" if it else f"{ep} epoch(s)" for ep, it in lengths]
    fig = make_subplots(rows=1, cols=len(lengths), subplot_titles=names, horizontal_spacing=0.06)
    lrs = sorted({r["lr"] for r in rows if r["lr"] is not None})
    batches = sorted({r["batch_size"] for r in rows if r["batch_size"] is not None})
    xs, ys = [f"{v:g}" for v in lrs], [str(b) for b in batches]
    for col, length in enumerate(lengths, 1):
        cells = {(r["batch_size"], r["lr"]): r for r in rows
                 if ((r["epochs"] or 0), (r["iterations"] or 0)) == length}
        z = [[cells[(b, lr)]["accuracy_median"] if (b, lr) in cells else None for lr in lrs]
             for b in batches]
        text = [[_grid_text(cells.get((b, lr))) for lr in lrs] for b in batches]
        fig.add_trace(go.Heatmap(
            x=xs, y=ys, z=z, text=text, texttemplate="%{text}", zmin=0, zmax=1,
            colorscale="Viridis", showscale=col == 1, hoverongaps=False,
            colorbar={"title": {"text": "accuracy"}, "tickformat": ".0%"},
            hovertemplate="lr %{x} · batch %{y}<br>%{text}<extra></extra>",
        ), row=1, col=col)
        # Diverged cells painted over in red: their accuracy is NaN, not low.
        bad = [[1 if (b, lr) in cells and cells[(b, lr)]["diverged"] else None for lr in lrs]
               for b in batches]
        if any(v for row in bad for v in row):
            fig.add_trace(go.Heatmap(
                x=xs, y=ys, z=bad, text=text, texttemplate="%{text}", showscale=False,
                colorscale=[[0, "#f3a59d"], [1, "#f3a59d"]], hoverongaps=False, name="diverged",
                hovertemplate="lr %{x} · batch %{y}: diverged (loss NaN / inf)<extra></extra>",
            ), row=1, col=col)
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=xs,
                         title_text="learning rate", row=1, col=col)
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=ys, row=1, col=col)
    fig.update_yaxes(title_text="batch size", row=1, col=1)
    title = f"Accuracy over batch size × learning rate — {label}"
    return base_layout(fig, title=plot_text(title), height=400)


def _grid_text(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["diverged"] and _num(r["accuracy_median"]) is None:
        return "NaN (diverged)"
    if _num(r["accuracy_median"]) is None:
        return "failed" if r["failed_runs"] else "–"
    mark = " ★" if r["best_accuracy"] else ""
    return f"{100 * r['accuracy_median']:.1f}%{mark}"


# --- A3 / B4-B6 / E10: scaling -------------------------------------------------------------


def scaling_figure(frame: pl.DataFrame, labels: Mapping[Any, str]) -> go.Figure:
    """Speedup (throughput over the 1-worker reference) and efficiency against the number
    of workers, one line per configuration and reference, with the linear limit y = x."""
    title = "Scaling over workers / GPUs / nodes: speedup with the linear limit"
    rows = frame.filter(pl.col("ref_cell_id").is_not_null() & pl.col("speedup").is_not_null())
    if rows.is_empty():
        return empty_figure(title, "No configuration has a 1-worker reference with a throughput.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("Speedup (throughput ÷ 1 worker)", "Efficiency (speedup ÷ workers)"))
    top = max(rows.get_column("workers").to_list())
    fig.add_trace(go.Scatter(x=[1, top], y=[1, top], mode="lines", name="linear (y = x)",
                             line={"color": "#999", "dash": "dash"}, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[1, top], y=[1, 1], mode="lines", name="linear", showlegend=False,
                             line={"color": "#999", "dash": "dash"}, hoverinfo="skip"), row=1, col=2)
    series = list(dict.fromkeys(zip(rows.get_column("config").to_list(),
                                    rows.get_column("ref_cell_id").to_list(),
                                    rows.get_column("scaling").to_list())))
    for i, (config, ref, scaling) in enumerate(series):
        part = rows.filter((pl.col("config") == config) & (pl.col("ref_cell_id") == ref)).sort("workers").to_dicts()
        batch = part[0]["per_worker_batch"] if scaling == "weak" else part[0]["global_batch"]
        what = f"per-worker batch {batch:g}" if scaling == "weak" else f"global batch {batch:g}"
        name = plot_text(f"{labels.get(config, config)} · {scaling} ({what})")
        words = [plot_text(verdict_text(r.get("verdict"), r.get("p_value"), r.get("test"))) for r in part]
        x = [r["workers"] for r in part]
        fig.add_trace(go.Scatter(
            x=x, y=[r["speedup"] for r in part], name=name, legendgroup=name, mode="lines+markers",
            line={"color": _color(i)}, customdata=[[w] for w in words],
            hovertemplate="<b>%{fullData.name}</b><br>%{x} workers: ×%{y:.2f}<br>"
                          "%{customdata[0]}<extra></extra>",
        ), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=x, y=[r["efficiency"] for r in part], name=name, legendgroup=name, showlegend=False,
            mode="lines+markers", line={"color": _color(i)},
            hovertemplate="<b>%{fullData.name}</b><br>%{x} workers: %{y:.0%} efficient<extra></extra>",
        ), row=1, col=2)
    fig.update_xaxes(title_text="workers", dtick=1, rangemode="tozero")
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", tickformat=".0%", row=1, col=2)
    return legend_below(fig, title)


# --- B7: convergence --------------------------------------------------------------------------


def convergence_figure(frame: pl.DataFrame, labels: Mapping[Any, str]) -> go.Figure:
    """Per cell: test accuracy (median, CI bars) and epoch time (median, CI) per epoch, and
    accuracy against the elapsed training time; epochs numbered from 1."""
    title = "Convergence: test accuracy and time per epoch (medians over repeats, bars: CI)"
    if frame.is_empty():
        return empty_figure(title, "No epoch has been recorded.")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=("Test accuracy per epoch", "Seconds per epoch",
                                        "Test accuracy vs elapsed training time"))
    for i, cell in enumerate(dict.fromkeys(frame.get_column("cell_id").to_list())):
        part = frame.filter(pl.col("cell_id") == cell).sort("epoch").to_dicts()
        name = plot_text(labels.get(cell, cell))
        x = [r["epoch"] + 1 for r in part]
        acc = [r["test_accuracy_median"] for r in part]
        spread = [plot_text(interval_text(r["test_accuracy_ci_low"], r["test_accuracy_ci_high"],
                                          r["test_accuracy_ci_level"], r["runs"], 2, True))
                  for r in part]
        common = {"name": name, "legendgroup": name, "line": {"color": _color(i)},
                  "mode": "lines+markers"}
        fig.add_trace(go.Scatter(
            x=x, y=acc, showlegend=True, **common,
            error_y=_bars(acc, [r["test_accuracy_ci_low"] for r in part],
                          [r["test_accuracy_ci_high"] for r in part]),
            customdata=[[s, r["runs"]] for s, r in zip(spread, part)],
            hovertemplate="<b>%{fullData.name}</b><br>epoch %{x}: %{y:.2%}<br>%{customdata[0]}"
                          "<br>%{customdata[1]} runs<extra></extra>",
        ), row=1, col=1)
        secs = [r["epoch_s_median"] for r in part]
        fig.add_trace(go.Scatter(
            x=x, y=secs, showlegend=False, **common,
            error_y=_bars(secs, [r["epoch_s_ci_low"] for r in part], [r["epoch_s_ci_high"] for r in part]),
            hovertemplate="<b>%{fullData.name}</b><br>epoch %{x}: %{y:,.2f} s<extra></extra>",
        ), row=1, col=2)
        fig.add_trace(go.Scatter(
            x=[r["elapsed_s"] for r in part], y=acc, showlegend=False, **common,
            hovertemplate="<b>%{fullData.name}</b><br>after %{x:,.1f} s: %{y:.2%}<extra></extra>",
        ), row=1, col=3)
    fig.update_xaxes(title_text="epoch", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="epoch", dtick=1, row=1, col=2)
    fig.update_xaxes(title_text="seconds of training", rangemode="tozero", row=1, col=3)
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", row=1, col=3)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    return legend_below(fig, title)


# --- D / E: layers ----------------------------------------------------------------------------


def layer_figure(part: pl.DataFrame, label: str) -> go.Figure:
    """One cell: forward and backward seconds per layer, stacked, in network order."""
    rows = part.sort("layer_index").to_dicts()
    names = [plot_text(f"{r['layer_index']}. {r['name']} ({r['kind']})") for r in rows]
    fig = go.Figure()
    for column, name, color in (("forward_s_median", "forward", _color(0)),
                                ("backward_s_median", "backward", _color(1))):
        fig.add_trace(go.Bar(
            y=names, x=[(r[column] or 0) * 1000 for r in rows], orientation="h", name=name,
            marker={"color": color}, customdata=[[r["share"]] for r in rows],
            hovertemplate=f"%{{y}}<br>{name} %{{x:,.3f}} ms<br>layer share %{{customdata[0]:.1%}}"
                          "<extra></extra>",
        ))
    fig.update_layout(barmode="stack", legend={"orientation": "h", "y": -0.15, "x": 0})
    fig.update_xaxes(title_text="milliseconds per step (median over runs)")
    fig.update_yaxes(autorange="reversed", automargin=True)
    title = f"Layer-wise forward and backward time — {label}"
    return base_layout(fig, title=plot_text(title), height=max(300, 110 + 24 * len(rows)))


def layer_kinds_figure(frame: pl.DataFrame, labels: Mapping[Any, str]) -> go.Figure:
    """Per cell: the share of the summed layer time taken by each kind of layer, stacked to
    100 % (convolutions against the rest)."""
    title = "Share of a step's layer time by kind of layer"
    if frame.is_empty():
        return empty_figure(title, "No cell ran with layer_profile.")
    cells = list(dict.fromkeys(zip(frame.get_column("sweep").to_list(),
                                   frame.get_column("cell_id").to_list())))
    y = [plot_text(labels.get(cell, cell)) for _, cell in cells]
    fig = go.Figure()
    for i, kind in enumerate(dict.fromkeys(frame.get_column("kind").to_list())):
        share = {(r["sweep"], r["cell_id"]): r for r in frame.filter(pl.col("kind") == kind).to_dicts()}
        fig.add_trace(go.Bar(
            y=y, x=[(share[c]["share"] if c in share else 0) for c in cells], orientation="h",
            name=plot_text(kind), marker={"color": _color(i)},
            customdata=[[(share[c]["total_s"] * 1000) if c in share else 0,
                         share[c]["layers"] if c in share else 0] for c in cells],
            hovertemplate="%{y}<br>%{fullData.name}: %{x:.1%} (%{customdata[0]:,.3f} ms, "
                          "%{customdata[1]} layers)<extra></extra>",
        ))
    fig.update_layout(barmode="stack", legend={"orientation": "h", "y": -0.2, "x": 0})
    fig.update_xaxes(tickformat=".0%", range=[0, 1], title_text="share of the summed layer time")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return base_layout(fig, title=title, height=max(280, 140 + 30 * len(cells)))


# --- C: where a step's time goes ---------------------------------------------------------------

#: The columns of iteration_model that make one configuration: its cells share one figure.
PHASE_GROUP = ("model", "dataset", "device", "threads", "batch_size", "workers")
#: The last segment of a bar: the sampled step less the sum of its phases.
NO_PHASE = "in no phase"
_NO_PHASE_COLOR = "#c4cad6"
# A fused phase (names joined by '+': one compiled program) is hatched, never split.
_FUSED_PATTERN = {"shape": "/", "fillmode": "overlay", "fgcolor": "white", "size": 7, "solidity": 0.3}


def phase_group_text(row: Mapping[str, Any]) -> str:
    """One configuration of iteration_model in words: model, data, device, threads, batch, workers."""
    workers = row.get("workers")
    return " · ".join([
        str(row.get("model")), str(row.get("dataset")), str(row.get("device")),
        f"{thread_text(row.get('threads'))} thread(s)", f"batch {row.get('batch_size')}",
        f"{workers} worker" + ("" if workers == 1 else "s")])


def phase_order(frame: pl.DataFrame) -> list[str]:
    """Every phase name of iteration_model rows in the order phases run: the cells' own orders
    (by ordinal) merged, so ``exchange`` stays before ``update`` although one cell has it and
    another not; first seen where no cell orders two names (cells that disagree: first seen)."""
    if frame.is_empty():
        return []
    sorter: TopologicalSorter[str] = TopologicalSorter()
    seen: list[str] = []
    for part in frame.select("cell_id", "ordinal", "phase").partition_by("cell_id", maintain_order=True):
        names = [str(n) for n in part.sort("ordinal", maintain_order=True).get_column("phase").to_list()]
        for i, name in enumerate(names):
            sorter.add(name, *names[i - 1:i])
        seen += names
    try:
        return list(sorter.static_order())
    except CycleError:
        return list(dict.fromkeys(seen))


def phase_colors(frame: pl.DataFrame) -> dict[str, str]:
    """A colour per phase name, in the order phases run (``phase_order``), for every figure."""
    return {name: _color(i) for i, name in enumerate(phase_order(frame))}


def _ms(seconds: Any) -> float | None:
    value = _num(seconds)
    return None if value is None else value * 1000


def phase_figure(part: pl.DataFrame, labels: Mapping[Any, str], group: str,
                 colors: Mapping[str, str]) -> go.Figure:
    """One configuration of iteration_model: a bar per cell, the medians of its phases stacked
    in the order they run (a fused phase hatched), then what no phase accounts for, in ms.

    A gap below zero (the phases' medians add up to a little more than the step's) is drawn as
    zero; its hover gives the true value.  Markers: the sampled step and the unsampled step
    (the one the throughput is computed from), both medians."""
    title = f"Where a step's time goes — {group}"
    if part.is_empty():
        return empty_figure(plot_text(title), "No cell sampled its phases.")
    cells = list(dict.fromkeys(part.get_column("cell_id").to_list()))
    fig = go.Figure()
    shown: set[str] = set()
    firsts = []
    rank = {name: i for i, name in enumerate(colors)}  # the legend lists phases in the order they run
    for cell in cells:
        rows = part.filter(pl.col("cell_id") == cell).sort("ordinal").to_dicts()
        y = [plot_text(labels.get(cell, cell))]
        firsts.append((y[0], rows[0]))
        for r in rows:
            name = str(r["phase"])
            fused = "+" in name
            fig.add_trace(go.Bar(
                y=y, x=[_ms(r["seconds_median"]) or 0.0], orientation="h",
                name=plot_text(f"{name} (fused)" if fused else name), legendgroup=plot_text(name),
                showlegend=name not in shown, legendrank=rank.get(name, len(rank)) + 1,
                marker={"color": colors.get(name, REFERENCE), "line": {"color": "white", "width": 1},
                        **({"pattern": _FUSED_PATTERN} if fused else {})},
                customdata=[[_num(r["share"]), r["samples"]]],
                hovertemplate="<b>%{y}</b><br>%{fullData.name}: %{x:,.3f} ms "
                              "(%{customdata[0]:.1%} of the sampled step)<br>"
                              "median of %{customdata[1]} sampled steps<extra></extra>",
            ))
            shown.add(name)
        gap = _ms(rows[0]["gap_s"])
        fig.add_trace(go.Bar(
            y=y, x=[max(gap or 0.0, 0.0)], orientation="h", name=NO_PHASE, legendgroup=NO_PHASE,
            showlegend=NO_PHASE not in shown, legendrank=900,
            marker={"color": _NO_PHASE_COLOR, "line": {"color": "white", "width": 1}},
            customdata=[[gap, _num(rows[0]["gap_share"])]],
            hovertemplate="<b>%{y}</b><br>in no phase: %{customdata[0]:,.4f} ms "
                          "(%{customdata[1]:.1%} of the sampled step)<extra></extra>",
        ))
        shown.add(NO_PHASE)
    names = [y for y, _ in firsts]
    fig.add_trace(go.Scatter(
        y=names, x=[_ms(r["sampled_step_s_median"]) for _, r in firsts], mode="markers",
        name="sampled step (median)", legendrank=901, marker={"symbol": "line-ns-open", "size": 26, "color": REFERENCE,
                                              "line": {"width": 2.5, "color": REFERENCE}},
        hovertemplate="<b>%{y}</b><br>sampled step %{x:,.3f} ms<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        y=names, x=[_ms(r["step_s_median"]) for _, r in firsts], mode="markers",
        name="unsampled step (median: the throughput's)", legendrank=902,
        marker={"symbol": "diamond-open", "size": 11, "color": REFERENCE, "line": {"width": 2}},
        customdata=[[_num(r["sampling_cost"])] for _, r in firsts],
        hovertemplate="<b>%{y}</b><br>unsampled step %{x:,.3f} ms<br>sampling adds "
                      "%{customdata[0]:.1%}<extra></extra>",
    ))
    fig.update_layout(barmode="stack", bargap=0.35)
    fig.update_xaxes(title_text="milliseconds per training step (medians over the sampled steps)",
                     rangemode="tozero")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return legend_below(fig, plot_text(title), plot_height=max(140, 56 * len(cells)))


_SERIES_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "pentagon", "star")


def predicted_scaling_figure(frame: pl.DataFrame, labels: Mapping[Any, str]) -> go.Figure:
    """iteration_scaling: the measured speedup (filled markers) and the model's predicted one
    (hollow, dashed) against the number of workers, one colour per framework, a line per
    configuration from its 1-worker reference (×1), with the linear limit y = workers."""
    title = "Predicted and measured speedup over workers, with the linear limit"
    rows = frame.filter(pl.col("speedup").is_not_null() | pl.col("predicted_speedup").is_not_null())
    if rows.is_empty():
        return empty_figure(title, "No multi-worker cell has both a calibration and a speedup yet.")
    fig = go.Figure()
    top = max(rows.get_column("workers").to_list())
    fig.add_trace(go.Scatter(x=[1, top], y=[1, top], mode="lines", name="linear (y = workers)",
                             line={"color": "#999", "dash": "dash"}, hoverinfo="skip"))
    frameworks = list(dict.fromkeys(rows.get_column("framework").to_list()))
    series = list(dict.fromkeys(zip(rows.get_column("config").to_list(),
                                    rows.get_column("ref_cell_id").to_list())))
    per_framework: dict[Any, int] = {}
    for config, ref in series:
        part = rows.filter((pl.col("config") == config) & (pl.col("ref_cell_id") == ref)).sort("workers").to_dicts()
        framework = part[0]["framework"]
        color = _color(frameworks.index(framework))
        symbol = _SERIES_SYMBOLS[per_framework.get(framework, 0) % len(_SERIES_SYMBOLS)]
        per_framework[framework] = per_framework.get(framework, 0) + 1
        name = plot_text(labels.get(config, config))
        x = [1, *[r["workers"] for r in part]]
        reference = [["the 1-worker reference", ""]]
        fig.add_trace(go.Scatter(
            x=x, y=[1.0, *[_num(r["speedup"]) for r in part]], name=f"{name} · measured",
            legendgroup=name, mode="lines+markers", line={"color": color},
            marker={"color": color, "symbol": symbol, "size": 10},
            customdata=reference + [[f"measured step {fmt_ms(r['measured_step_s'])}", ""] for r in part],
            hovertemplate="<b>%{fullData.name}</b><br>%{x} workers: ×%{y:.2f}<br>%{customdata[0]}"
                          "<extra></extra>",
        ))
        fig.add_trace(go.Scatter(
            x=x, y=[1.0, *[_num(r["predicted_speedup"]) for r in part]], name=f"{name} · predicted",
            legendgroup=name, mode="lines+markers", line={"color": color, "dash": "dot"},
            marker={"color": color, "symbol": f"{symbol}-open", "size": 12, "line": {"width": 2}},
            customdata=reference + [[
                f"step {fmt_ms(r['predicted_step_s'])} = compute {fmt_ms(r['compute_s'])} "
                f"+ exposed exchange {fmt_ms(r['exposed_s'])}",
                "" if _num(r["prediction_error"]) is None
                else f"{100 * r['prediction_error']:+.1f}% against the measured speedup"] for r in part],
            hovertemplate="<b>%{fullData.name}</b><br>%{x} workers: ×%{y:.2f}<br>%{customdata[0]}"
                          "<br>%{customdata[1]}<extra></extra>",
        ))
    fig.update_xaxes(title_text="workers", dtick=1, rangemode="tozero")
    fig.update_yaxes(title_text="speedup over the 1-worker cell", rangemode="tozero")
    return legend_below(fig, title)


def fmt_ms(seconds: Any) -> str:
    """Seconds as milliseconds in words (``12.500 ms``; ``–`` when missing)."""
    value = _ms(seconds)
    return "–" if value is None else f"{value:,.3f} ms"


# --- E: options -----------------------------------------------------------------------------


def option_figure(frame: pl.DataFrame, labels: Mapping[Any, str]) -> go.Figure:
    """Throughput ratio of each option against matrun's default value, everything else
    equal; a bar is coloured only when the difference is significant."""
    title = "Options: throughput against the default value (1 = no change; grey: not significant)"
    if frame.is_empty():
        return empty_figure(title, "No pair of cells differs in one option only.")
    rows = frame.to_dicts()
    y = [plot_text(f"{r['option']}: {r['ref_value']} → {r['value']} · {labels.get(r['config'], r['config'])}")
         for r in rows]
    fig = go.Figure(go.Bar(
        y=y, x=[r["throughput_ratio"] for r in rows], orientation="h", base=0,
        marker={"color": [_verdict_color(r["verdict"], r["significant"]) for r in rows]},
        text=[plot_text(f"×{r['throughput_ratio']:.2f} · {r['verdict']}")
              if _num(r.get("throughput_ratio")) is not None else "" for r in rows],
        textposition="outside",
        customdata=[[plot_text(verdict_text(r["verdict"], r.get("p_value"), r.get("test"))),
                     r["runs"], r["ref_runs"]] for r in rows],
        hovertemplate="%{y}<br>throughput ×%{x:.2f}<br>%{customdata[0]}<br>"
                      "%{customdata[1]} runs against %{customdata[2]}<extra></extra>",
    ))
    fig.add_vline(x=1, line={"color": "#666", "dash": "dash"})
    top = max([_num(r["throughput_ratio"]) or 0.0 for r in rows] + [1.0])
    fig.update_xaxes(title_text="median throughput ÷ the default's", range=[0, top * 1.35])
    fig.update_yaxes(autorange="reversed", automargin=True)
    return base_layout(fig, title=title, height=max(280, 140 + 30 * len(rows)))


# --- Pareto -------------------------------------------------------------------------------------


def pareto_figure(part: pl.DataFrame, labels: Mapping[Any, str], group: str) -> go.Figure:
    """One (model, dataset, device): each cell's median training time against its median
    accuracy, both with intervals; the front (no cell both faster and more accurate) is
    drawn bold and joined, dominated cells faded."""
    rows = part.sort("train_s_median").to_dicts()
    fig = go.Figure()
    front = [r for r in rows if r["on_front"]]
    if front:
        fig.add_trace(go.Scatter(
            x=[r["train_s_median"] for r in front], y=[r["accuracy_median"] for r in front],
            mode="lines", line={"shape": "hv", "color": "#333", "width": 1.5}, name="Pareto front",
            hoverinfo="skip",
        ))
    for i, fw in enumerate(dict.fromkeys(r["framework"] for r in rows)):
        for on_front in (True, False):
            pts = [r for r in rows if r["framework"] == fw and bool(r["on_front"]) == on_front]
            if not pts:
                continue
            x = [r["train_s_median"] for r in pts]
            y = [r["accuracy_median"] for r in pts]
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="markers", name=plot_text(f"{fw} · {'on the front' if on_front else 'dominated'}"),
                marker={"color": _color(i), "size": 13 if on_front else 8,
                        "opacity": 1.0 if on_front else 0.45,
                        "line": {"width": 2 if on_front else 0, "color": "#111"},
                        "symbol": "diamond" if on_front else "circle"},
                error_x=_bars(x, [r["train_s_ci_low"] for r in pts], [r["train_s_ci_high"] for r in pts]),
                error_y=_bars(y, [r["accuracy_ci_low"] for r in pts], [r["accuracy_ci_high"] for r in pts]),
                customdata=[[plot_text(labels.get(r["cell_id"], r["cell_id"])), r["dominated_by"], r["runs"]]
                            for r in pts],
                hovertemplate="<b>%{customdata[0]}</b><br>%{x:,.2f} s · %{y:.2%}<br>"
                              "dominated by %{customdata[1]} cell(s) · %{customdata[2]} runs<extra></extra>",
            ))
    fig.update_xaxes(title_text="median training seconds (lower is better)", rangemode="tozero")
    fig.update_yaxes(title_text="median test accuracy (higher is better)", tickformat=".0%")
    title = f"Training time against accuracy — {group}"
    return legend_below(fig, plot_text(title), plot_height=320)
