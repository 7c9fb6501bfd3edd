"""The study pages' own parts: verdicts, the paper's table beside this host's, their ratios.

Pure functions (frames in, ``Html`` and Plotly figures out; no database, no files) over the
study catalogue (``data.Catalogue``: the ``studies`` table, the ``findings`` view) and the
medians of the study's cells (``data.read_cell_levels``).  ``site.py`` puts them on a page
per study present and the verdict table of every study on the index (docs/REPORT.md,
"Study pages").

The paper's numbers come from other hardware, so they are never compared in seconds: each
value is divided by the first row of its series, for the paper (its rows in its order) and
for this host (its cells ordered by the paper's ``x``, from the first one the paper has too),
and the shapes are compared.  A finding's verdict is the warehouse's (the findings view);
the report colours it only when it is ``reproduced`` or ``contradicted``.  Every value from
the data passes through ``pages.esc`` (via ``table`` / ``tag``), every figure text through
``plot_text``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import plotly.graph_objects as go
import polars as pl

from matrun.reports.figures import PALETTE, legend_below, plot_text
from matrun.reports.pages import Html, csv_text, download_link, join, table, tag
from matrun.reports.sections import flag, fmt, is_missing, num
from matrun.reports.shape import label_parts
from matrun.warehouse.findings import PaperTable as Paper

# The verdicts of the findings view, and the only two the report colours.
VERDICTS = ("reproduced", "contradicted", "not significant", "not enough data")
_VERDICT_STYLE = {
    "reproduced": ("sig", "the paper's finding holds on this host (significant, p < 0.05)"),
    "contradicted": ("bad", "this host shows the opposite, significantly (p < 0.05)"),
    "not significant": ("muted", "the test cannot tell: no significant difference at p < 0.05"),
    "not enough data": ("muted", "the cells the check needs have not run (enough) here"),
}

# The metrics a paper's value may compare with: the cell_stats column of the host's median
# and how the report names it.  step_s is derived: seconds per image, 1 / throughput.
METRICS: dict[str, tuple[str, str]] = {
    "train_s": ("train_s_median", "training s"),
    "test_s": ("test_s_median", "test s"),
    "accuracy": ("accuracy_median", "accuracy"),
    "throughput": ("throughput_median", "images/s"),
    "epoch_s": ("epoch_s_median", "s / epoch"),
    "rss_peak_mb": ("rss_peak_mb", "peak memory MiB"),
    "cpu_total": ("cpu_total_median", "CPU %"),
    "device_memory_peak_mb": ("device_memory_peak_mb", "device memory MiB"),
    "step_s": ("throughput_median", "s / image"),
}
HOST_SERIES_LIMIT = 8
"""The figure draws at most this many of this host's series (the table has them all)."""


# --- the studies present --------------------------------------------------------------------


@dataclass(frozen=True)
class StudyInfo:
    """A study with a page: its declaration and the cells of the report it covers."""

    id: str
    title: str
    file: str
    """Its page, ``study-<id>.html`` (the id made safe for a file name)."""
    slug: str
    """The id as it appears in the page's and CSV files' names."""
    seed: str
    source: str
    needs: str
    view: str | None
    matrix: str
    paper: Paper | None
    cells: tuple[str, ...]
    """Its registered cells that have runs in the report."""
    profiles: tuple[str, ...]

    def csv(self, name: str) -> str:
        """The file name of one of the page's CSV files."""
        return f"study-{self.slug}-{name}"


def study_sort_key(study_id: str) -> tuple[Any, ...]:
    """A1, A2, …, A10, then B…: letters, then the number as a number, then the rest."""
    match = re.match(r"^([A-Za-z]*)(\d*)(.*)$", study_id, re.S)
    assert match is not None
    letters, number, rest = match.groups()
    return (letters == "", letters, int(number) if number else -1, rest)


def safe_name(study_id: str) -> str:
    """A study id as part of a file name: letters, digits, ``-`` and ``_`` only."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", study_id)[:64] or "_"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def parse_paper(value: Any) -> Paper | None:
    """The ``paper`` JSON of the studies table as a ``PaperTable`` (the declaration's own type;
    None when absent or unreadable)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    columns = value.get("columns") or []
    rows = value.get("rows") or []
    if not isinstance(columns, list) or not isinstance(rows, list):
        return None
    width = len(columns)
    shaped = tuple(tuple((list(r) + [None] * width)[:width]) if isinstance(r, list) else (None,) * width
                   for r in rows)
    x, metric = value.get("x"), value.get("metric")
    return Paper(source=_text(value.get("source")), note=_text(value.get("note")),
                 x=str(x) if x else None, metric=str(metric) if metric else None,
                 columns=tuple(str(c) for c in columns), rows=shaped)


def present_studies(studies: pl.DataFrame, cells: pl.DataFrame, run_cells: Iterable[str]) -> list[StudyInfo]:
    """The studies with at least one registered cell that has runs in the report, in id order.

    ``studies`` and ``cells`` are the catalogue's tables (empty frames when the warehouse has
    none), ``run_cells`` the cell ids of the report's runs.
    """
    if studies.is_empty() or cells.is_empty() or "study" not in studies.columns:
        return []
    ran = set(run_cells)
    registered: dict[str, list[str]] = {}
    profiles: dict[str, list[str]] = {}
    for row in cells.iter_rows(named=True):
        if row["cell_id"] in ran:
            registered.setdefault(row["study"], []).append(row["cell_id"])
            profiles.setdefault(row["study"], []).append(_text(row.get("profile")))
    out: list[StudyInfo] = []
    taken: set[str] = set()
    rows = sorted(studies.iter_rows(named=True), key=lambda r: study_sort_key(str(r["study"])))
    for row in rows:
        sid = str(row["study"])
        if sid not in registered:
            continue
        slug = safe_name(sid)
        base, n = slug, 2
        while slug.lower() in taken:  # two ids that read the same once made safe
            slug, n = f"{base}-{n}", n + 1
        taken.add(slug.lower())
        view = row.get("view")
        out.append(StudyInfo(
            id=sid, title=_text(row.get("title")), file=f"study-{slug}.html", slug=slug,
            seed=_text(row.get("seed")), source=_text(row.get("source")), needs=_text(row.get("needs")),
            view=str(view) if view else None, matrix=_text(row.get("matrix")),
            paper=parse_paper(row.get("paper")),
            cells=tuple(dict.fromkeys(registered[sid])),
            profiles=tuple(dict.fromkeys(p for p in profiles[sid] if p))))
    return out


def study_findings(findings: pl.DataFrame, study_id: str) -> pl.DataFrame:
    """The findings view's rows of one study, in the view's order (position, configuration)."""
    if findings.is_empty() or "study" not in findings.columns:
        return pl.DataFrame()
    rows = findings.filter(pl.col("study") == study_id)
    order = [c for c in ("position", "finding", "config", "cell_id") if c in rows.columns]
    return rows.sort(order, nulls_last=True, maintain_order=True) if order else rows


def declared_findings(declared: pl.DataFrame, study_id: str) -> pl.DataFrame:
    """A study's findings as declared (``study_findings``), for a warehouse without verdicts."""
    if declared.is_empty() or "study" not in declared.columns:
        return pl.DataFrame()
    rows = declared.filter(pl.col("study") == study_id)
    return rows.sort("position") if "position" in rows.columns else rows


# --- verdicts ---------------------------------------------------------------------------------


def finding_badge(verdict: Any) -> Html:
    """A finding's verdict: green only when reproduced, red only when contradicted."""
    if verdict is None:
        return Html(flag("not checked", "muted", "the warehouse has no verdict for this finding"))
    kind, title = _VERDICT_STYLE.get(str(verdict), ("muted", None))
    return flag(verdict, kind, title)


def _p_value(value: Any) -> Html:
    return num("–" if is_missing(value) else f"{value:.3g}")


def config_label(row: Mapping[str, Any]) -> str:
    """A findings row's configuration in words: the view's ``config_label`` (framework · model ·
    dataset, then what differs between the study's configurations; docs/WAREHOUSE.md), or "no
    runs yet" for a finding without a configuration."""
    return str(row.get("config_label") or "no runs yet")


def verdict_table(rows: pl.DataFrame, *, csv_href: str, table_id: str = "verdicts-table") -> Html:
    """A study's findings, one row per (finding, configuration): the claim and its citation,
    the verdict, the numbers behind it (observed, expected), the test and its p-value."""
    dicts = rows.to_dicts()
    body = []
    for r in dicts:
        runs = None if r.get("n") is None else f"{fmt(r.get('n'))} vs {fmt(r.get('ref_n'))}"
        body.append([
            tag("code", r.get("finding")), r.get("claim"), r.get("cite"), config_label(r),
            finding_badge(r.get("verdict")), r.get("observed"), r.get("expected"),
            _p_value(r.get("p_value")), r.get("test"), num(runs or "–"),
        ])
    head = tag("div", join([tag("h3", "Verdicts on this host"), download_link(csv_href)]),
               class_="table-head")
    return join([head, tag("div", table(
        ["finding", "claim", "cite", "configuration", "verdict", "observed", "expected", "p-value",
         "test", "runs"], body,
        row_classes=[_verdict_class(r.get("verdict")) for r in dicts], id=table_id),
        class_="scroll")])


def _verdict_class(verdict: Any) -> str | None:
    return {"reproduced": "reproduced", "contradicted": "contradicted"}.get(str(verdict))


def declared_table(rows: pl.DataFrame) -> Html:
    """A study's declared findings when the warehouse has no verdict for them."""
    body = [[tag("code", r.get("finding")), r.get("claim"), r.get("cite"), r.get("check_kind"),
             finding_badge(None)] for r in rows.to_dicts()]
    return tag("div", table(["finding", "claim", "cite", "check", "verdict"], body,
                            id="verdicts-table"), class_="scroll")


def index_verdict_table(studies: Sequence[StudyInfo], findings: pl.DataFrame, *, csv_href: str) -> Html:
    """The index's table: every finding of every study present, linked to its study's page."""
    body: list[list[Any]] = []
    classes: list[str | None] = []
    for info in studies:
        rows = study_findings(findings, info.id).to_dicts()
        link = tag("a", join([tag("b", info.id), " ", info.title]), href=info.file)
        if not rows:
            body.append([link, tag("span", "no verdict (no finding declared, or none checked)",
                                   class_="sub"), "–", finding_badge(None), "–"])
            classes.append(None)
            continue
        for r in rows:
            body.append([link, join([tag("code", r.get("finding")), tag("span", r.get("claim"), class_="sub")]),
                         config_label(r), finding_badge(r.get("verdict")), r.get("observed")])
            classes.append(_verdict_class(r.get("verdict")))
    head = tag("div", join([tag("h3", "Verdicts per study, finding and configuration"),
                            download_link(csv_href)]), class_="table-head")
    return join([head, tag("div", table(["study", "finding", "configuration", "verdict", "observed"],
                                        body, row_classes=classes, id="index-verdicts-table"),
                           class_="scroll")])


def findings_csv(rows: pl.DataFrame) -> str:
    """The findings view's rows as CSV: every column, in the view's order."""
    return csv_text(rows.columns, rows.iter_rows())


# --- the paper's table and this host's, shaped like it ------------------------------------


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def match_key(value: Any) -> str:
    """A value of ``x`` as the paper and this host can both write it: ``4`` = ``4.0`` = ``"4"``."""
    if isinstance(value, bool):
        return str(value).lower()
    numeric_text = isinstance(value, str) and re.fullmatch(r"\s*-?[0-9.eE+]+\s*", value)
    if isinstance(value, (int, float)) or numeric_text:
        try:
            number = float(value)
        except ValueError:
            return str(value).strip().lower()
        if math.isfinite(number) and number == int(number):
            return str(int(number))
        return repr(number)
    return "" if value is None else str(value).strip().lower()


def x_order(value: Any, known: Sequence[str] = ()) -> tuple[int, float, int]:
    """Where a value of ``x`` goes: numbers ascending, then texts (``unset``, ``nchw``) in the
    order of ``known`` (the paper's, as ``match_key``s), then any other text."""
    key = match_key(value)
    try:
        return (0, float(key), 0)
    except ValueError:
        return (1, 0.0, list(known).index(key) if key in known else len(known))


def paper_x_order(paper: Paper | None) -> list[str]:
    """The paper's values of ``x`` (as ``match_key``s), in the order of its rows."""
    if paper is None or paper.x not in paper.columns:
        return []
    xi = paper.columns.index(paper.x)
    return list(dict.fromkeys(match_key(r[xi]) for r in paper.rows))


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper's table with its series and its ratio to the series' first row
    (in ``x`` order)."""

    cells: tuple[Any, ...]
    series: str
    x: Any
    value: float | None
    ratio: float | None
    base: Any
    """The ``x`` of the row the ratio divides by (its series' smallest ``x`` with a value)."""


def value_index(paper: Paper) -> int | None:
    """The column of the paper's table the host's metric compares with (``metric``)."""
    return paper.columns.index(paper.metric) if paper.metric in paper.columns else None


def paper_rows(paper: Paper) -> list[PaperRow]:
    """The paper's rows in its order, each with its series (the text columns other than
    ``x``) and its value ÷ the series' first value in ``x`` order (its smallest ``x``)."""
    xi = paper.columns.index(paper.x) if paper.x in paper.columns else None
    vi = value_index(paper)
    known = paper_x_order(paper)
    series_cols = [i for i in range(len(paper.columns)) if i not in (xi, vi)
                   and all(_number(r[i]) is None for r in paper.rows)]
    shaped = []
    for r in paper.rows:
        series = " · ".join(_text(r[i]) for i in series_cols if r[i] is not None)
        shaped.append((series, r[xi] if xi is not None else None,
                       _number(r[vi]) if vi is not None else None, r))
    bases: dict[str, tuple[Any, float]] = {}
    for series, x, value, _ in sorted(shaped, key=lambda s: x_order(s[1], known)):  # stable
        if value and series not in bases:
            bases[series] = (x, value)
    out = []
    for series, x, value, r in shaped:
        base = bases.get(series)
        out.append(PaperRow(cells=r, series=series, x=x, value=value,
                            ratio=value / base[1] if value is not None and base is not None else None,
                            base=base[0] if base else None))
    return out


@dataclass(frozen=True)
class HostRow:
    """One cell of the study on this host, shaped like a row of the paper's table."""

    cell_id: str
    series: str
    x: Any
    values: dict[str, Any]
    value: float | None
    ratio: float | None
    base: Any
    matched: bool
    """Whether the paper has a row at this ``x``."""
    runs: int
    series_keys: tuple[str, ...] = ()
    """The parameters whose values tell this host's series apart."""


def metric_value(row: Mapping[str, Any], metric: str | None) -> float | None:
    """The host's median of ``metric`` for one cell (cell_stats row), None when unknown."""
    if metric not in METRICS:
        return None
    value = _number(row.get(METRICS[metric][0]))
    if metric == "step_s":
        return 1.0 / value if value else None
    return value


# Parameters that always tell series apart, even where each takes one value per x.
SERIES_KEYS = frozenset({"framework", "variant", "model", "dataset", "device", "mode"})


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _follows(xs: Sequence[Any], values: Sequence[Any]) -> bool:
    """Whether ``values`` are a function of ``xs`` (one value per x: a learning rate zipped
    with the batch size, iterations that follow it), so they do not make series of their own."""
    seen: dict[str, str] = {}
    return all(seen.setdefault(match_key(x), _json(v)) == _json(v) for x, v in zip(xs, values))


def host_rows(cells: pl.DataFrame, paper: Paper | None, *, x: str | None,
              metric: str | None) -> list[HostRow]:
    """The study's cells (rows of ``read_cell_levels``) as rows shaped like the paper's:
    grouped into series by the parameters other than ``x`` that differ between them (less
    those that follow ``x``: one value per ``x``), ordered by ``x`` (``x_order``), each with
    its median of ``metric`` and that median ÷ its series' base: its first row at an ``x``
    the paper has too, else its first row."""
    if cells.is_empty():
        return []
    dicts = cells.to_dicts()
    params = []
    for row in dicts:
        p = row.get("params")
        try:
            p = json.loads(p) if isinstance(p, str) else (p or {})
        except ValueError:
            p = {}
        params.append(p if isinstance(p, dict) else {})
    xs = [p.get(x, row.get(x)) if x else None for row, p in zip(dicts, params)]
    rest = [{k: v for k, v in p.items() if k != x and k != "seed"} for p in params]
    keys = list(dict.fromkeys(k for p in rest for k in p))
    varying = [k for k in keys if len({_json(p.get(k)) for p in rest}) > 1
               and (k in SERIES_KEYS or not x or not _follows(xs, [p.get(k) for p in rest]))]
    names = [" · ".join(parts) for parts in label_parts(rest, varying)]
    paper_x = set(paper_x_order(paper))
    built = []
    for row, p, series, xv in zip(dicts, params, names, xs):
        built.append((series, xv, row, {**row, **p}))
    order = list(dict.fromkeys(s for s, *_ in built))
    known = paper_x_order(paper)
    built.sort(key=lambda b: (order.index(b[0]), x_order(b[1], known)))
    bases: dict[str, tuple[Any, float]] = {}
    for series, xv, row, _ in built:
        value = metric_value(row, metric)
        if value and match_key(xv) in paper_x and series not in bases:
            bases[series] = (xv, value)
    for series, xv, row, _ in built:
        value = metric_value(row, metric)
        if value and series not in bases:
            bases[series] = (xv, value)
    out = []
    for series, xv, row, values in built:
        value = metric_value(row, metric)
        base = bases.get(series)
        out.append(HostRow(
            cell_id=str(row.get("cell_id")), series=series, x=xv, values=values, value=value,
            ratio=value / base[1] if value is not None and base is not None else None,
            base=base[0] if base else None, matched=match_key(xv) in paper_x,
            runs=int(row.get("runs") or 0), series_keys=tuple(varying)))
    return out


def _ratio_cell(ratio: float | None, x: str | None, base: Any) -> Html:
    if ratio is None:
        return num("–")
    return num(f"×{ratio:,.2f}", f"÷ {x}={base}" if x else None)


def _metric_text(metric: str | None, value: Any) -> str:
    if is_missing(value):
        return "–"
    if metric == "accuracy":
        return f"{100 * value:.2f}%"
    if metric == "step_s":
        return f"{value:.3g}"
    return fmt(value, 2)


def _ratio_header(paper: Paper) -> str:
    return f"{paper.metric or 'value'} ÷ first row"


def _with_ratio(paper: Paper, cells: Sequence[Any], ratio: Any) -> list[Any]:
    """``cells`` (one per column of the paper) with ``ratio`` right after the metric's."""
    vi = value_index(paper)
    out = list(cells)
    if vi is not None:
        out.insert(vi + 1, ratio)
    return out


def paper_table(paper: Paper, rows: Sequence[PaperRow], *, csv_href: str) -> Html:
    """The paper's table as transcribed, each value of the metric followed by its ratio to
    its series' first row."""
    headers = _with_ratio(paper, paper.columns, _ratio_header(paper))
    body = [_with_ratio(paper, [_paper_cell(v) for v in r.cells], _ratio_cell(r.ratio, paper.x, r.base))
            for r in rows]
    title = f"The paper: {paper.source}" if paper.source else "The paper"
    head = tag("div", join([tag("h3", title), download_link(csv_href)]), class_="table-head")
    return join([head, tag("div", table(headers, body, id="paper-table"), class_="scroll")])


def _paper_cell(value: Any) -> Any:
    """A number of the paper's table as transcribed (``1,114.34``, ``99.0``, ``4``)."""
    return num(f"{value:,}") if _number(value) is not None else value


def host_cell(row: HostRow, column: str, paper: Paper) -> Any:
    """This host's value for one of the paper's columns."""
    if column == paper.x:
        return num(fmt(row.x)) if _number(row.x) is not None else row.x
    if column == paper.metric:
        return num(_metric_text(paper.metric, row.value))
    if column in METRICS:
        return num(_metric_text(column, metric_value(row.values, column)))
    value = row.values.get(column)
    return num(fmt(value, 2)) if _number(value) is not None else value


def host_table(paper: Paper, rows: Sequence[HostRow], *, csv_href: str) -> Html:
    """This host's cells in the paper's columns, matched on ``x``, with their ratios (and a
    series column when what tells its series apart is not among the paper's columns)."""
    series = any(k not in paper.columns for r in rows for k in r.series_keys)
    headers = [*(["series"] if series else []),
               *_with_ratio(paper, paper.columns, _ratio_header(paper)), "runs"]
    body, classes = [], []
    for r in rows:
        runs = num(fmt(r.runs), None if r.matched or not paper.x else f"no {paper.x}={r.x} in the paper")
        body.append([*([r.series] if series else []),
                     *_with_ratio(paper, [host_cell(r, c, paper) for c in paper.columns],
                                  _ratio_cell(r.ratio, paper.x, r.base)), runs])
        classes.append(None if r.matched or not paper.x else "unmatched")
    head = tag("div", join([tag("h3", "This host, shaped like it"), download_link(csv_href)]),
               class_="table-head")
    note = tag("p", "One row per cell of the study that ran here, in the paper's columns (a "
                    "dash where this host has no such number), grouped into series by what "
                    "differs between the cells besides the paper's x; rows at an x the paper "
                    "does not have are greyed.", class_="note")
    return join([head, note, tag("div", table(headers, body, row_classes=classes, id="host-table"),
                                 class_="scroll")])


def shapes_table(paper: Paper, prow: Sequence[PaperRow], hrow: Sequence[HostRow], *,
                 csv_href: str) -> Html | None:
    """The two side by side, matched on ``x``: one row per value of ``x`` (the paper's and
    this host's), one column per series of the paper and of this host, each cell the ratio
    to its series' base with the number under it.  None without an ``x`` or a metric."""
    if not paper.x or value_index(paper) is None:
        return None
    known = paper_x_order(paper)
    xs = sorted({match_key(r.x): r.x for r in [*prow, *hrow] if r.x is not None}.items(),
                key=lambda kv: x_order(kv[1], known))
    pseries = list(dict.fromkeys(r.series for r in prow))
    hseries = list(dict.fromkeys(r.series for r in hrow))
    by_p = {(r.series, match_key(r.x)): r for r in prow}
    by_h = {(r.series, match_key(r.x)): r for r in hrow}
    unit = METRICS.get(paper.metric or "", ("", paper.metric or ""))[1]
    body, classes = [], []
    for key, x in xs:
        cells: list[Any] = [num(fmt(x)) if _number(x) is not None else x]
        for name in pseries:
            r = by_p.get((name, key))
            cells.append(num("–") if r is None or r.ratio is None
                         else num(f"×{r.ratio:,.2f}", f"{r.value:,} in the paper"))
        for name in hseries:
            h = by_h.get((name, key))
            cells.append(num("–") if h is None or h.ratio is None
                         else num(f"×{h.ratio:,.2f}", f"{_metric_text(paper.metric, h.value)} here"))
        body.append(cells)
        classes.append(None if key in known else "unmatched")
    headers = [paper.x, *(f"paper · {n}" if n else "paper" for n in pseries),
               *(f"this host · {n}" if n else "this host" for n in hseries)]
    head = tag("div", join([tag("h3", f"Shapes side by side: {unit} ÷ the first row of each series"),
                            download_link(csv_href)]), class_="table-head")
    bases = sorted({f"{paper.x}={r.base}" for r in [*prow, *hrow] if r.base is not None})
    note = tag("p", join(["Each column is one series divided by its own base (", ", ".join(bases) or "–",
                          "): read across a row to compare how the paper and this host change "
                          "with ", tag("code", paper.x), ", never the seconds themselves."]),
               class_="note")
    return join([head, note, tag("div", table(headers, body, row_classes=classes, id="shapes-table"),
                                 class_="scroll")])


def shapes_csv(paper: Paper, prow: Sequence[PaperRow], hrow: Sequence[HostRow]) -> str:
    """The side-by-side ratios, long: source (paper / host), series, x, value, ratio, base."""
    return csv_text(["source", "series", "x", "value", "ratio", "ratio_base"],
                    [*(["paper", r.series, r.x, r.value, r.ratio, r.base] for r in prow),
                     *(["host", r.series, r.x, r.value, r.ratio, r.base] for r in hrow)])


def paper_csv(paper: Paper, rows: Sequence[PaperRow]) -> str:
    """The paper's table with its series and ratio columns."""
    return csv_text([*paper.columns, "series", "ratio", "ratio_base"],
                    [[*r.cells, r.series, r.ratio, r.base] for r in rows])


def host_csv(paper: Paper | None, rows: Sequence[HostRow]) -> str:
    """This host's rows: cell, series, x, the paper's columns, the metric and its ratio."""
    columns = list(paper.columns) if paper else []
    x = paper.x if paper else None
    return csv_text(
        ["cell_id", "series", "x", *columns, "metric", "runs", "matched", "ratio", "ratio_base"],
        [[r.cell_id, r.series, r.x,
          *(r.x if c == x else r.value if paper and c == paper.metric
            else metric_value(r.values, c) if c in METRICS else r.values.get(c) for c in columns),
          r.value, r.runs, r.matched, r.ratio, r.base] for r in rows])


def hardware_banner(paper: Paper, host: str) -> Html:
    """Say, visibly, that the hardware differs and what is compared instead of seconds."""
    theirs = join(["the paper's numbers were measured on ", tag("b", paper.note)]) if paper.note \
        else Html("the paper's numbers were measured on other hardware")
    return tag("p", join([
        "⚠ Different hardware: ", theirs, "; this host is ", tag("b", host or "another machine"),
        ". Seconds are not comparable between them: compare the shapes and ratios (each value ÷ "
        "the first row of its series), not the times."]), class_="banner warn", id="hardware")


def ratio_figure(paper: Paper, prow: Sequence[PaperRow], hrow: Sequence[HostRow]) -> go.Figure | None:
    """The paper's ratio series (dashed) and this host's (solid) against ``x``, with the line
    at 1; None when there is nothing to draw (no ``x``, or fewer than two ratios)."""
    if not paper.x or sum(r.ratio is not None for r in [*prow, *hrow]) < 2:
        return None
    xs = [r.x for r in [*prow, *hrow] if r.ratio is not None]
    numeric = all(_number(v) is not None or _is_numeric_text(v) for v in xs)
    def xval(v: Any) -> Any:
        return float(match_key(v)) if numeric else plot_text(v)
    fig = go.Figure()
    metric = plot_text(METRICS.get(paper.metric or "", ("", paper.metric or "value"))[1])
    series = list(dict.fromkeys(r.series for r in prow))
    for i, name in enumerate(series):
        part = [r for r in prow if r.series == name and r.ratio is not None]
        if not part:
            continue
        fig.add_trace(go.Scatter(
            x=[xval(r.x) for r in part], y=[r.ratio for r in part], mode="lines+markers",
            name=plot_text(f"paper · {name}" if name else "paper"),
            line={"dash": "dash", "color": PALETTE[i % len(PALETTE)]},
            marker={"symbol": "diamond", "size": 9},
            customdata=[[r.value] for r in part],
            hovertemplate=f"<b>%{{fullData.name}}</b><br>{plot_text(paper.x)}=%{{x}}<br>"
                          f"×%{{y:.2f}} ({metric} %{{customdata[0]:,.4g}} in the paper)<extra></extra>"))
    host_series = list(dict.fromkeys(r.series for r in hrow))[:HOST_SERIES_LIMIT]
    for j, name in enumerate(host_series):
        part = [r for r in hrow if r.series == name and r.ratio is not None]
        if not part:
            continue
        fig.add_trace(go.Scatter(
            x=[xval(r.x) for r in part], y=[r.ratio for r in part], mode="lines+markers",
            name=plot_text(f"this host · {name}" if name else "this host"),
            line={"color": PALETTE[(len(series) + j) % len(PALETTE)], "width": 2.5},
            customdata=[[r.value] for r in part],
            hovertemplate=f"<b>%{{fullData.name}}</b><br>{plot_text(paper.x)}=%{{x}}<br>"
                          f"×%{{y:.2f}} ({metric} %{{customdata[0]:,.4g}} here)<extra></extra>"))
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "#8c95a6", "width": 1})
    axis: dict[str, Any] = {"title": plot_text(paper.x)}
    if numeric:
        values = [float(match_key(v)) for v in xs]
        if min(values) > 0 and max(values) / min(values) >= 8:
            axis.update(type="log")
        if len(set(values)) <= 12:
            axis.update(tickvals=sorted(set(values)))
    else:
        known = paper_x_order(paper)
        ordered = sorted(xs, key=lambda v: x_order(v, known))
        axis.update(type="category", categoryorder="array",
                    categoryarray=list(dict.fromkeys(plot_text(v) for v in ordered)))
    fig.update_xaxes(**axis)
    fig.update_yaxes(title=f"{metric} ÷ first row of its series", rangemode="tozero")
    source = plot_text(paper.source or "the paper")
    title = f"{source}: shapes, not seconds — {metric} relative to each series' first row"
    return legend_below(fig, title)


def _is_numeric_text(value: Any) -> bool:
    try:
        float(match_key(value))
    except ValueError:
        return False
    return True


def study_lead(info: StudyInfo) -> Html:
    """What the study reproduces, from where, and with which profiles it ran here."""
    parts: list[Any] = ["Reproduces ", tag("b", info.source or "a study"),
                        " of the seed ", tag("code", info.seed or "–")]
    if info.needs:
        parts += [" (needs: ", info.needs, ")"]
    parts.append(". ")
    if info.profiles:
        parts += ["Profiles run here: ", join((tag("code", p) for p in info.profiles), ", "), ". "]
    if info.matrix:
        parts += ["Matrix: ", tag("code", info.matrix.rsplit("/", 1)[-1]), ". "]
    parts.append(f"{len(info.cells)} cell(s) of the study ran in this report. A verdict is the "
                 "warehouse's (the findings view): 'reproduced' and 'contradicted' only when the "
                 "Mann–Whitney test finds the difference significant (p < 0.05), else 'not "
                 "significant', or 'not enough data' when the cells the check needs have not run.")
    return join(parts)


def cells_of(levels: pl.DataFrame, cells: Sequence[str]) -> pl.DataFrame:
    """The rows of ``read_cell_levels`` of ``cells``."""
    if levels.is_empty() or "cell_id" not in levels.columns:
        return pl.DataFrame()
    return levels.filter(pl.col("cell_id").is_in(list(cells)))

