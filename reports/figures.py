"""Figure builders: a DataFrame in, a Plotly figure out.  No I/O, no database.

Every builder expects the rows it draws to carry a ``label`` column (the cell's label,
see ``shape.cell_labels``) and takes an optional ``colors`` map from label to colour so a
cell has the same colour in every figure of the report.
"""

from __future__ import annotations

import html
import math
import re
from typing import Mapping, Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

# Colour-blind friendly (Okabe-Ito, then Tableau 10 for more cells).
PALETTE: tuple[str, ...] = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
    "#4E79A7", "#F28E2B", "#E15759", "#76B7B2", "#59A14F", "#EDC948", "#B07AA1", "#FF9DA7",
    "#9C755F", "#BAB0AC",
)
TEMPLATE = "plotly_white"
MIB = 2**20  # the report's memory unit, as in the baseline view's *_mb columns (MiB)
_FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13}


def plot_text(value: object) -> str:
    """Text for Plotly, which reads a subset of HTML in labels (``<b>``, ``<a>``, ``<br>``).

    Escaping ``&``, ``<`` and ``>`` makes it show a label literally: Plotly turns the
    entities back into characters when it draws, and never parses the label as markup.
    """
    return html.escape(str(value), quote=False)


def cell_colors(labels: Sequence[str]) -> dict[str, str]:
    """A colour per label, in order, cycling through the palette."""
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(dict.fromkeys(labels))}


def _colors(frame: pl.DataFrame, colors: Mapping[str, str] | None) -> Mapping[str, str]:
    if colors is not None:
        return colors
    return cell_colors(frame.get_column("label").to_list()) if "label" in frame.columns else {}


def base_layout(fig: go.Figure, *, title: str, height: int) -> go.Figure:
    """The report's look for every figure: template, left-aligned title, height, font, margins."""
    fig.update_layout(
        template=TEMPLATE, title={"text": title, "x": 0.0, "xanchor": "left"},
        height=height, font=_FONT, margin={"l": 60, "r": 30, "t": 70, "b": 50},
        hoverlabel={"namelength": -1},
    )
    return fig


def legend_below(fig: go.Figure, title: str, *, plot_height: int = 300) -> go.Figure:
    """Title, size and a legend below the plot that never overlaps the axis titles.

    The plot area keeps ``plot_height`` pixels whatever the legend's length: the figure
    grows by the legend's rows (estimated from its entries' text) instead.
    """
    names = list(dict.fromkeys(t.name for t in fig.data if t.showlegend is not False and t.name))
    width = sum(8 * len(n) + 60 for n in names)  # about 8 px a character at 13 px
    rows = math.ceil(width / 1000) if names else 0
    bottom = 100 + 22 * rows
    fig = base_layout(fig, title=title, height=70 + plot_height + bottom)
    fig.update_layout(margin={"b": bottom},
                      legend={"orientation": "h", "yanchor": "top", "y": -90 / plot_height, "x": 0})
    return fig


def empty_figure(title: str, message: str) -> go.Figure:
    """A figure with no data: ``title`` and ``message`` in its middle, no axes."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 15, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return base_layout(fig, title=title, height=260)


def throughput_figure(
    baseline: pl.DataFrame, colors: Mapping[str, str] | None = None
) -> go.Figure:
    """Median training throughput per cell, with the min-max over repeats as error bars.

    Horizontal bars, one per cell, in the order of ``baseline``, first at the top; the
    hover shows the spread, the coefficient of variation and the number of runs.
    """
    title = "Training throughput per cell (median over repeats, bars: min–max)"
    rows = baseline.filter(pl.col("throughput_median").is_not_null())
    if rows.is_empty():
        return empty_figure(title, "No cell has a successful run with a throughput yet.")
    palette = _colors(rows, colors)
    labels = rows.get_column("label").to_list()
    median = rows.get_column("throughput_median").to_list()
    low = rows.get_column("throughput_min").to_list()
    high = rows.get_column("throughput_max").to_list()
    cv = rows.get_column("throughput_cv").to_list()
    runs = rows.get_column("runs").to_list()
    fig = go.Figure(go.Bar(
        y=[plot_text(label) for label in labels], x=median, orientation="h",
        marker={"color": [palette.get(label, PALETTE[0]) for label in labels]},
        error_x={
            "type": "data", "symmetric": False, "color": "#333", "thickness": 1.5, "width": 6,
            "array": [_gap(h, m) for h, m in zip(high, median)],
            "arrayminus": [_gap(m, lo) for m, lo in zip(median, low)],
        },
        customdata=list(zip(low, high, [_percent(v) for v in cv], runs)),
        hovertemplate=(
            "<b>%{y}</b><br>median %{x:,.1f} images/s<br>"
            "min %{customdata[0]:,.1f} · max %{customdata[1]:,.1f}<br>"
            "CV %{customdata[2]} · %{customdata[3]} runs<extra></extra>"
        ),
        text=[f"{m:,.0f}" for m in median], textposition="inside", insidetextanchor="start",
        textfont={"color": "white"}, name="throughput",
    ))
    fig.update_xaxes(title_text="images / second (higher is better)", rangemode="tozero")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return base_layout(fig, title=title, height=max(260, 120 + 34 * len(labels)))


def _gap(a: float | None, b: float | None) -> float:
    return max(0.0, a - b) if a is not None and b is not None else 0.0


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def epoch_figure(
    epoch_curve: pl.DataFrame, colors: Mapping[str, str] | None = None
) -> go.Figure:
    """Two panels sharing the epoch axis: test accuracy (min-max bars) and seconds per epoch.

    One line per cell, the same colour in both panels; epochs are numbered from 1.
    """
    title = "Accuracy and training time per epoch (medians over repeats)"
    if epoch_curve.is_empty():
        return empty_figure(title, "No epoch has been recorded yet.")
    palette = _colors(epoch_curve, colors)
    fig = make_subplots(
        rows=1, cols=2, horizontal_spacing=0.09,
        subplot_titles=("Test accuracy", "Training seconds per epoch"),
    )
    order = list(dict.fromkeys([*palette, *epoch_curve.get_column("label").to_list()]))
    for raw in order:
        part = epoch_curve.filter(pl.col("label") == raw).sort("epoch")
        if part.is_empty():
            continue
        name = plot_text(raw)
        epochs = [e + 1 for e in part.get_column("epoch").to_list()]
        color = palette.get(raw, PALETTE[0])
        acc = part.get_column("test_accuracy_median").to_list()
        acc_min = part.get_column("test_accuracy_min").to_list()
        acc_max = part.get_column("test_accuracy_max").to_list()
        fig.add_trace(go.Scatter(
            x=epochs, y=acc, name=name, legendgroup=name, mode="lines+markers",
            line={"color": color}, marker={"color": color},
            error_y={"type": "data", "symmetric": False, "thickness": 1, "width": 3,
                     "array": [_gap(h, m) for h, m in zip(acc_max, acc)],
                     "arrayminus": [_gap(m, lo) for m, lo in zip(acc, acc_min)]},
            hovertemplate="<b>%{fullData.name}</b><br>epoch %{x}<br>"
                          "test accuracy %{y:.2%}<extra></extra>",
        ), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=epochs, y=part.get_column("epoch_seconds_median").to_list(), name=name,
            legendgroup=name, showlegend=False, mode="lines+markers",
            line={"color": color, "dash": "dot"}, marker={"color": color, "symbol": "square"},
            hovertemplate="<b>%{fullData.name}</b><br>epoch %{x}<br>"
                          "%{y:.2f} s training<extra></extra>",
        ), row=1, col=2)
    last = max(epoch_curve.get_column("epoch").to_list()) + 1
    fig.update_xaxes(title_text="epoch", dtick=1, range=[0.5, last + 0.5])
    fig.update_yaxes(title_text="test accuracy", tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="seconds", rangemode="tozero", row=1, col=2)
    return legend_below(fig, title)


def _monitor_title(run_label: str) -> str:
    return f"Monitor: CPU and memory over time<br><sup>{plot_text(run_label)}</sup>"


# Traces per run in the monitor figure: user CPU, system CPU, iowait, RSS.
_MONITOR_TRACES = 4


def monitor_figure(
    samples: pl.DataFrame, runs: Sequence[tuple[str, str]], selected: str
) -> go.Figure:
    """CPU (user and system, stacked; iowait) and resident memory over one run's time.

    ``samples`` holds monitor rows (``run_id, t, cpu_user, cpu_system, iowait,
    rss_bytes``) of every run in ``runs``, a sequence of (run_id, menu label).  Only
    ``selected`` is visible at first; with more than one run a drop-down switches between
    them.  CPU is percent of one core (200 = two cores busy); memory in MiB (2^20 bytes).
    """
    title = "Monitor: CPU and memory over time"
    if samples.is_empty() or not runs:
        return empty_figure(title, "No monitor samples for this run.")
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.55, 0.45],
        subplot_titles=("CPU % of one core (summed over the cell's processes)",
                        "Resident memory (MiB)"),
    )
    order = [run_id for run_id, _ in runs]
    for run_id in order:
        part = samples.filter(pl.col("run_id") == run_id).sort("t")
        visible = run_id == selected
        t = part.get_column("t").to_list()
        stack = f"cpu-{order.index(run_id)}"
        for column, name, color in (("cpu_user", "user", "#0072B2"),
                                    ("cpu_system", "system", "#D55E00")):
            fig.add_trace(go.Scatter(
                x=t, y=part.get_column(column).to_list(), name=f"CPU {name}",
                stackgroup=stack, mode="lines", line={"width": 0.8, "color": color},
                visible=visible, legendgroup=name,
                hovertemplate=f"{name} %{{y:.0f}}%<extra></extra>",
            ), row=1, col=1)
        fig.add_trace(go.Scatter(
            x=t, y=part.get_column("iowait").to_list(), name="iowait (host)", mode="lines",
            line={"width": 1, "color": "#999", "dash": "dot"}, visible=visible,
            legendgroup="iowait", hovertemplate="iowait %{y:.1f}%<extra></extra>",
        ), row=1, col=1)
        rss = [None if b is None else b / MIB for b in part.get_column("rss_bytes").to_list()]
        fig.add_trace(go.Scatter(
            x=t, y=rss, name="RSS", mode="lines", fill="tozeroy",
            line={"width": 1.2, "color": "#009E73"}, visible=visible, legendgroup="rss",
            hovertemplate="RSS %{y:,.1f} MiB<extra></extra>",
        ), row=2, col=1)
    if len(order) > 1:
        buttons = []
        for i, (run_id, menu_label) in enumerate(runs):
            mask = [j // _MONITOR_TRACES == i for j in range(_MONITOR_TRACES * len(order))]
            buttons.append({"label": plot_text(menu_label), "method": "update",
                            "args": [{"visible": mask}, {"title.text": _monitor_title(menu_label)}]})
        fig.update_layout(updatemenus=[{
            "buttons": buttons, "active": order.index(selected), "direction": "down",
            "x": 0.0, "xanchor": "left", "y": 1.09, "yanchor": "bottom", "showactive": True,
            "bgcolor": "white", "bordercolor": "#b8c2d3", "font": {"size": 12},
        }])
    fig.update_xaxes(title_text="seconds since the cell started", row=2, col=1)
    fig.update_yaxes(title_text="CPU %", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="MiB", rangemode="tozero", row=2, col=1)
    fig.update_layout(hovermode="x unified",
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.09, "x": 1,
                              "xanchor": "right"})
    selected_label = dict(runs).get(selected, selected)
    fig = base_layout(fig, title=_monitor_title(selected_label), height=640)
    fig.update_layout(margin={"t": 150}, title={"y": 0.98, "yanchor": "top"})
    return fig


# Markers of a release's verdict against the one before it (matrun history).
_VERDICT_SYMBOL = {"faster": "triangle-up", "more accurate": "triangle-up", "better": "triangle-up",
                   "slower": "triangle-down", "less accurate": "triangle-down", "worse": "triangle-down"}


def release_figure(points: Sequence[Mapping[str, object]], *, framework: str, metric: str, unit: str) -> go.Figure:
    """A framework's workloads across its releases (``matrun history``'s points, in order):
    one line per workload, the median with its interval as error bars; a significant change
    against the release before is a triangle (up: better, down: worse), the rest dots."""
    title = f"{framework}: {metric} across releases (median, bars: its interval)"
    if not points:
        return empty_figure(title, "No workload of this framework has two releases yet.")
    order: list[str] = []
    for p in sorted(points, key=lambda p: _release_key(str(p["point"]))):
        if p["point"] not in order:
            order.append(str(p["point"]))
    fig = go.Figure()
    colors = cell_colors([str(p["label"]) for p in points])
    for label in colors:
        mine = [p for p in points if p["label"] == label]
        median = [p["median"] for p in mine]
        fig.add_trace(go.Scatter(
            x=[plot_text(p["point"]) for p in mine], y=median, mode="lines+markers", name=plot_text(label),
            line={"color": colors[label]},
            marker={"size": 11, "symbol": [_VERDICT_SYMBOL.get(str(p["verdict"]), "circle") for p in mine]},
            error_y={"type": "data", "symmetric": False, "thickness": 1.2, "width": 5,
                     "array": [_gap(p["ci_high"], p["median"]) for p in mine],  # type: ignore[arg-type]
                     "arrayminus": [_gap(p["median"], p["ci_low"]) for p in mine]},  # type: ignore[arg-type]
            customdata=[[p["n"], plot_text(p["verdict"] or "first release")] for p in mine],
            hovertemplate=(f"<b>{plot_text(label)}</b><br>%{{x}}: %{{y:,.2f}} {plot_text(unit)}<br>"
                           "%{customdata[0]} runs · %{customdata[1]}<extra></extra>"),
        ))
    fig.update_xaxes(title_text="release", type="category", categoryorder="array",
                     categoryarray=[plot_text(r) for r in order])
    fig.update_yaxes(title_text=f"{metric} ({unit})" if unit else metric, rangemode="tozero")
    return legend_below(fig, title)


def _release_key(release: str) -> tuple:
    """Versions in order: their numbers compared as numbers, then the text."""
    return tuple(int(d) for d in re.findall(r"[0-9]+", release)), release
