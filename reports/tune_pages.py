"""A page per tuning of ``matrun tune`` (the warehouse's ``tunings`` and ``tuning_trials``;
docs/TUNE.md): the answer per framework against its default, which parameters mattered, the
trace (best so far against runs spent) and every trial."""

from __future__ import annotations

import csv
import io
import re
from typing import Any, Mapping

import plotly.graph_objects as go

from matrun.reports.figures import empty_figure, legend_below, plot_text
from matrun.reports.pages import Html, figure, join, table, tag
from matrun.reports.sections import section

_ID = re.compile(r"^[0-9a-f]{1,64}\Z")


def page_file(tuning: str) -> str:
    """``tune-<id>.html`` (an id that is not hex, which matrun never writes, is not given a page)."""
    return f"tune-{tuning}.html"


def pages_of(tunings: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [t for t in tunings if isinstance(t.get("tuning"), str) and _ID.match(t["tuning"])]


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 10 ** digits else f"{v:,.{digits}g}"


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _colors(summary: Mapping[str, Any]) -> dict[str, str]:
    """One colour per framework, in the answer's order, the same in every figure of the page."""
    names = [str(a.get("framework")) for a in summary.get("answer") or []]
    return {fw: _COLORS[i % len(_COLORS)] for i, fw in enumerate(names)}


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.2f} %"


def trace_figure(summary: Mapping[str, Any]) -> go.Figure:
    title = f"best feasible {summary.get('objective')} so far against runs spent"
    points = [p for p in summary.get("trace") or [] if p.get("best") is not None]
    if not points:
        return empty_figure(title, "No feasible configuration measured yet.")
    fig = go.Figure()
    colors = _colors(summary)
    for fw in dict.fromkeys(str(p.get("framework")) for p in points):
        mine = [p for p in points if str(p.get("framework")) == fw]
        fig.add_trace(go.Scatter(x=[p["runs"] for p in mine], y=[p["best"] for p in mine], mode="lines+markers",
                                 line={"shape": "hv", "color": colors.get(fw)}, name=plot_text(fw),
                                 hovertemplate=f"{plot_text(fw)}: %{{x}} runs: %{{y:,.2f}}<extra></extra>"))
    fig.update_xaxes(title_text="runs spent", rangemode="tozero")
    fig.update_yaxes(title_text=f"{summary.get('objective')} ({plot_text(summary.get('unit') or '')})")
    return legend_below(fig, title)


def importance_figure(summary: Mapping[str, Any]) -> go.Figure:
    title = "which parameters mattered (Optuna's PED-ANOVA importance over the feasible trials)"
    imp = summary.get("importance") or {}
    if not imp:
        return empty_figure(title, "Fewer than four feasible trials, or all of them alike: no importance.")
    fig = go.Figure()
    names = list(dict.fromkeys(n for per in imp.values() for n in per))[::-1]
    colors = _colors(summary)
    for fw in sorted(imp, key=lambda f: list(colors).index(f) if f in colors else len(colors)):
        per = imp[fw]
        fig.add_trace(go.Bar(x=[per.get(n, 0.0) for n in names], y=[plot_text(n) for n in names], orientation="h",
                             name=plot_text(fw), marker={"color": colors.get(fw)}, hovertemplate=f"{plot_text(fw)} %{{y}}: %{{x:.2f}}<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="importance", range=[0, 1])
    return legend_below(fig, title)


def trials_csv(trials: list[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    cols = ["trial", "kind", "framework", "label", "cell_id", "state", "value", "accuracy", "runs", "seconds", "reason"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for t in trials:
        w.writerow(["" if t.get(c) is None else t.get(c) for c in cols])
    return buf.getvalue()


def tuning_body(t: Mapping[str, Any]) -> tuple[Html, list[tuple[str, str]], dict[str, str]]:
    """(body, in-page anchors, CSV files) of a tuning's page."""
    s = t.get("summary") or {}
    tid = t["tuning"]
    lead = (f"matrun tune of {t['matrix']} (sweep {t['sweep']}): {t['objective']} ({t['direction']}), sampler "
            f"{t['sampler']}, seed {t['seed']}"
            + (f", accuracy at most {t['accuracy_within']:g} points below each framework's default"
               if t.get("accuracy_within") is not None else "")
            + f"; {s.get('space_size', (t.get('space') or {}).get('size', '?')):,} combinations; status {t['status']}.")
    rows = []
    for a in s.get("answer") or []:
        d, b, c = a.get("default") or {}, a.get("best") or {}, a.get("comparison") or {}
        ratio = (f"{c['ratio']:.3f}× ({_num(c.get('ratio_low'), 3)}–{_num(c.get('ratio_high'), 3)})"
                 if c.get("ratio") is not None else "-")
        rows.append([a["framework"], f"{d.get('label', '-')} ({d.get('cell_id') or '-'})",
                     f"{b.get('label', '-')} ({b.get('cell_id') or '-'})", ", ".join(a.get("changes") or []) or "-",
                     f"{d.get('runs', 0)}/{b.get('runs', 0)}", _num(d.get("median")), _num(b.get("median")), ratio,
                     _num(c.get("p_value"), 3), _pct(d.get("accuracy")), _pct(b.get("accuracy")), a.get("verdict"),
                     "; ".join(a.get("noise") or []) or "-"])
    answer = section(
        "answer", "The answer: the best configuration per framework against its default",
        "The default is the matrix with every searched parameter at matrun's default; the best is the "
        "feasible trial with the best median, or the default itself when no trial beat it. The speedup is the "
        "ratio of medians with its Hodges–Lehmann interval; 'better' needs a two-sided Mann–Whitney p < 0.05, "
        "'within 5 %' an interval inside ±5 %. Noise: a side whose runs vary by more than 5 % (CV), or fall "
        "into two modes.",
        table(["framework", "default", "best", "changes", "runs D/B", "default", "best", "ratio", "p", "acc D",
               "acc B", "verdict", "noise"], rows) if rows else tag("p", "No answer yet."))
    counts = s.get("trials") or {}
    stats = tag("p", f"{s.get('runs', 0)} runs spent over {len(t.get('trials') or [])} trials "
                     f"({counts.get('ok', 0)} ok, {counts.get('infeasible', 0)} infeasible, {counts.get('failed', 0)} "
                     f"failed, {counts.get('refused', 0)} refused at plan time); stopped: "
                     f"{s.get('stopped_because') or t['status']}.")
    trace = section("trace", "Trace", "The best feasible value found after each trial that ran something "
                    "(the default cell's first).", stats, figure(trace_figure(s), f"fig-trace-{tid}"))
    importance = section("importance", "Which parameters mattered", "", figure(importance_figure(s),
                                                                               f"fig-importance-{tid}"))
    trial_rows = [[r["trial"], r["kind"], r.get("framework") or "-", r["label"], r.get("cell_id") or "-", r["state"],
                   _num(r.get("value")), _pct(r.get("accuracy")), r["runs"], r.get("reason") or ""]
                  for r in t.get("trials") or []]
    csv_name = f"tune-{tid}-trials.csv"
    trials = section("trials", "Every trial", tag("a", "CSV", href=csv_name),
                     table(["trial", "kind", "framework", "configuration", "cell", "state", "value", "accuracy",
                            "runs", "why"], trial_rows) if trial_rows else tag("p", "No trial yet."))
    body = join([tag("p", lead, class_="lead"), answer, trace, importance, trials], "\n")
    anchors = [("answer", "Answer"), ("trace", "Trace"), ("importance", "Importance"), ("trials", "Trials")]
    return body, anchors, {csv_name: trials_csv(t.get("trials") or [])}
