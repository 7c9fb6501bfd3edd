"""The study pages of the report and the verdict table of its index (docs/REPORT.md, "Study pages").

A warehouse of fixture bundles (``bundle_factory``), sweep ``a6`` on a 2-CPU host, one epoch
per run, four runs per cell (so Mann-Whitney can reach p = 2/70 < 0.05):

    cell     threads   throughput (img/s)            train s (median)
    t1       1         99.7, 99.9, 100.1, 100.3      60    (59.7 … 60.3)
    t2       2         179.7 … 180.3 (median 180)    35
    t4       4         149.7 … 150.3 (median 150)    45

Study ``A6`` (cells t1, t2, t4) declares two findings: ``oversubscription`` (throughput at
4 threads, above the 2 CPUs, against the best at or below 2: 150 < 180, significant:
reproduced) and ``slower-with-threads`` (a trend: train s increases with threads; it
decreases from 60 to 45, significantly: contradicted), and the paper's Table XII with
threads 1, 2, 4, 8 and train s 1000, 600, 400, 800 (ratios ×1.00, ×0.60, ×0.40, ×0.80);
this host's ratios: ×1.00, ×0.58 (35 / 60), ×0.75 (45 / 60).  Study ``B7-evil`` (cells t1,
t2) has an attack in every text it declares.  Study ``C1`` is registered on cells that never
ran: it gets no page.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from bundle_factory import make_bundle
from test_report import Node, parse
from matrun.reports import study_pages as sp
from matrun.reports.build import build_report
from matrun.reports.data import read_catalogue
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.findings import parse_study, register_study
from matrun.warehouse.ingest import ingest

SWEEP = "a6"
CELLS = {"t1": (1, 100.0, 60.0), "t2": (2, 180.0, 35.0), "t4": (4, 150.0, 45.0)}
XSS_TITLE = "<script>window.__xss=1</script>Evil \"title\" 'quoted'"
XSS_CLAIM = '"><img src=x onerror=window.__xss=2>claim'
XSS_NOTE = "<svg onload=window.__xss=3>hardware"
FORMULA_CELL = "=cmd|' /C calc'!A0"
XSS_COLUMN = "<b>framework</b>"

A6 = {
    "study": {"id": "A6", "title": "BLAS thread count", "seed": "000_55992cd604dc8adf.txt",
              "source": "Table XII", "needs": "cpu", "view": "thread_sweep"},
    "findings": [
        {"id": "oversubscription", "claim": "More threads than cores slows training",
         "cite": "Section 4.2, Table XII", "check": "oversubscription", "x": "threads",
         "metric": "throughput"},
        {"id": "slower-with-threads", "claim": "Training time grows with the thread count",
         "cite": "Table XII", "check": "trend", "x": "threads", "metric": "train_s",
         "expect": "increases"},
    ],
    "paper": {"source": "Table XII",
              "note": "TensorFlow on MNIST, 2 x Xeon E5-2650 v4 (24 cores / 48 threads)",
              "x": "threads", "metric": "train_s",
              "columns": ["framework", "threads", "train_s", "accuracy"],
              "rows": [["TensorFlow", 1, 1000.0, 99.2], ["TensorFlow", 2, 600.0, 99.2],
                       ["TensorFlow", 4, 400.0, 99.1], ["TensorFlow", 8, 800.0, 99.0]]},
}
EVIL = {
    "study": {"id": "B7-evil", "title": XSS_TITLE, "seed": "evil.txt", "source": "Fig <i>9</i>",
              "needs": "cpu"},
    "findings": [{"id": "evil", "claim": XSS_CLAIM, "cite": "<script>alert(1)</script>",
                  "check": "trend", "x": "threads", "metric": "train_s", "expect": "decreases"}],
    "paper": {"source": "Table <script>alert(2)</script>", "note": XSS_NOTE, "x": "threads",
              "metric": "train_s", "columns": [XSS_COLUMN, "threads", "train_s"],
              "rows": [[FORMULA_CELL, 1, 10.0], ["<img src=y onerror=window.__xss=4>", 2, 5.0]]},
}
C1 = {"study": {"id": "C1", "title": "Never ran", "needs": "cpu"},
      "findings": [{"id": "nothing", "claim": "c", "cite": "c", "check": "trend", "x": "threads",
                    "metric": "train_s", "expect": "increases"}]}


def _decl(doc: dict[str, Any]) -> Any:
    problems: list[str] = []
    decl = parse_study(doc, lambda where, message: problems.append(f"{where}: {message}"))
    assert decl is not None and not problems, problems
    return decl


def write_bundles(results: Path) -> None:
    for cell, (threads, throughput, seconds) in CELLS.items():
        for repeat in range(4):
            step = (repeat - 1.5) * 0.2
            make_bundle(results, sweep=SWEEP, cell_id=cell, repeat=repeat,
                        params={"threads": threads, "epochs": 1}, throughput=throughput + step,
                        epochs=({"train_loss": 0.5, "train_accuracy": 0.7, "test_loss": 0.5,
                                 "test_accuracy": 0.8, "epoch_seconds": seconds + step,
                                 "test_seconds": 1.0},))


def register(warehouse: Path, root: Path) -> None:
    with open_warehouse(warehouse) as wh:
        register_study(wh.con, _decl(A6), profile="quick", matrix=str(root / "studies/A6-threads.toml"),
                       cell_ids=list(CELLS))
        register_study(wh.con, _decl(EVIL), profile=None, matrix=str(root / "studies/B7-evil.toml"),
                       cell_ids=["t1", "t2"])
        register_study(wh.con, _decl(C1), profile="quick", matrix=str(root / "studies/C1.toml"),
                       cell_ids=["ffffffffffffffff"])


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("studies")
    write_bundles(root / "results")
    path = root / "matrun.duckdb"
    report = ingest([root / "results"], warehouse=path)
    assert len(report.ingested) == 12 and not report.skipped, report
    register(path, root)
    return path


@pytest.fixture(scope="module")
def site(warehouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_report(warehouse=warehouse, out_dir=tmp_path_factory.mktemp("site") / "report").parent


def findings_rows(warehouse: Path) -> list[dict[str, Any]]:
    with open_warehouse(warehouse, read_only=True) as wh:
        frame = pl.from_arrow(wh.con.sql("SELECT * FROM findings").to_arrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.to_dicts()


# --- the report's DOM helpers (tests/test_report.py) ------------------------------------------


def rows_of(dom: Node, table_id: str) -> tuple[list[str], list[list[Node]]]:
    table = dom.find("table", id=table_id)
    headers = [th.text().strip() for th in table.find_all("th")]
    body = table.find("tbody")
    rows = [[td for td in tr.children if isinstance(td, Node) and td.tag == "td"] for tr in body.find_all("tr")]
    return headers, rows


def main_text(td: Node) -> str:
    """A numeric cell's number (without the small line under it)."""
    spans = [s for s in td.find_all("span") if s.attrs.get("class") == "n"]
    return spans[0].text() if spans else td.text()


def sub_text(td: Node) -> str:
    return " ".join(s.text() for s in td.find_all("span") if s.attrs.get("class") == "sub")


def badges(td: Node) -> list[tuple[str, str]]:
    return [(s.text(), s.attrs.get("class") or "") for s in td.find_all("span")
            if (s.attrs.get("class") or "").startswith("flag")]


def figure_spec(dom: Node, div_id: str) -> dict[str, Any]:
    for script in dom.find_all("script"):
        text = script.text()
        if f'Plotly.newPlot("{div_id}"' in text:
            return json.loads(text.split("var fig = ", 1)[1].split(";\nPlotly.newPlot", 1)[0])
    raise AssertionError(f"no figure {div_id}")


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


# --- the site -------------------------------------------------------------------------------


def test_a_page_per_study_with_runs_linked_from_every_page(site: Path) -> None:
    pages = sorted(p.name for p in site.glob("study-*.html"))
    assert pages == ["study-A6.html", "study-B7-evil.html"]  # C1's cells never ran
    for name in ["index.html", "threads.html", *pages]:
        nav = parse(site / name).find("nav", **{"class": "pages"})
        links = {a.attrs["href"]: a.text() for a in nav.find_all("a")}
        assert links["study-A6.html"] == "A6" and links["study-B7-evil.html"] == "B7-evil", name
        assert "study-C1.html" not in links
    current = parse(site / "study-A6.html").find("nav", **{"class": "pages"}).find("a", href="study-A6.html")
    assert current.attrs.get("aria-current") == "page"


def test_the_study_page_opens_with_its_verdicts(site: Path, warehouse: Path) -> None:
    dom = parse(site / "study-A6.html")
    sections = [s.attrs.get("id") for s in dom.find("main").children if isinstance(s, Node)]
    assert sections[:2] == ["verdicts", "paper"] and "host" in sections
    assert dom.find("section", id="verdicts").find("h2").text() == "Study A6: BLAS thread count"
    headers, rows = rows_of(dom, "verdicts-table")
    assert headers == ["finding", "claim", "cite", "configuration", "verdict", "observed", "expected",
                       "p-value", "test", "runs"]
    view = {r["finding"]: r for r in findings_rows(warehouse) if r["study"] == "A6"}
    assert view["oversubscription"]["verdict"] == "reproduced"
    assert view["slower-with-threads"]["verdict"] == "contradicted"
    got = {}
    for row in rows:
        cells = dict(zip(headers, row))
        got[cells["finding"].text()] = cells
    assert list(got) == ["oversubscription", "slower-with-threads"]  # the view's order
    for finding, cells in got.items():
        expect = view[finding]
        assert cells["claim"].text() == expect["claim"]
        assert cells["cite"].text() == expect["cite"]
        assert cells["observed"].text() == expect["observed"] and expect["observed"]
        assert cells["expected"].text() == expect["expected"]
        assert main_text(cells["p-value"]) == f"{expect['p_value']:.3g}"
        assert cells["test"].text() == expect["test"]
        assert main_text(cells["runs"]) == f"{expect['n']} vs {expect['ref_n']}"
        # the view's label, one source of truth for the page, the CSV files and any query
        assert cells["configuration"].text() == expect["config_label"] == "torch · lenet5 · fashion-mnist"
    assert badges(got["oversubscription"]["verdict"]) == [("reproduced", "flag sig")]
    assert badges(got["slower-with-threads"]["verdict"]) == [("contradicted", "flag bad")]


def test_the_paper_table_beside_this_hosts_as_ratios(site: Path) -> None:
    dom = parse(site / "study-A6.html")
    section = dom.find("section", id="paper")
    assert section.find("h2").text() == "The paper's Table XII beside this host"
    banner = section.find("p", id="hardware").text()
    assert "Different hardware" in banner
    assert "TensorFlow on MNIST, 2 x Xeon E5-2650 v4 (24 cores / 48 threads)" in banner
    assert "Fixture CPU, 2 CPUs" in banner  # this host, from the runs' provenance
    assert "Seconds are not comparable" in banner and "compare the shapes and ratios" in banner

    headers, rows = rows_of(dom, "shapes-table")  # side by side, matched on threads
    assert headers == ["threads", "paper · TensorFlow", "this host"]
    assert [[main_text(td) for td in r] for r in rows] == [
        ["1", "×1.00", "×1.00"], ["2", "×0.60", "×0.58"], ["4", "×0.40", "×0.75"], ["8", "×0.80", "–"]]
    assert sub_text(rows[1][1]) == "600.0 in the paper" and sub_text(rows[1][2]) == "35.00 here"

    headers, rows = rows_of(dom, "paper-table")  # the ratio right after the paper's metric
    assert headers == ["framework", "threads", "train_s", "train_s ÷ first row", "accuracy"]
    assert [[main_text(td) for td in r] for r in rows] == [
        ["TensorFlow", "1", "1,000.0", "×1.00", "99.2"], ["TensorFlow", "2", "600.0", "×0.60", "99.2"],
        ["TensorFlow", "4", "400.0", "×0.40", "99.1"], ["TensorFlow", "8", "800.0", "×0.80", "99.0"]]
    assert sub_text(rows[2][3]) == "÷ threads=1"

    headers, rows = rows_of(dom, "host-table")
    assert headers == ["framework", "threads", "train_s", "train_s ÷ first row", "accuracy", "runs"]
    assert [[main_text(td) for td in r] for r in rows] == [
        ["torch", "1", "60.00", "×1.00", "80.00%", "4"], ["torch", "2", "35.00", "×0.58", "80.00%", "4"],
        ["torch", "4", "45.00", "×0.75", "80.00%", "4"]]
    assert sub_text(rows[2][3]) == "÷ threads=1"

    fig = figure_spec(dom, "fig-paper-ratios")
    traces = {t["name"]: t for t in fig["data"]}
    paper = traces["paper · TensorFlow"]  # the paper's series: its text columns
    assert paper["x"] == [1, 2, 4, 8] and paper["line"]["dash"] == "dash"
    assert [round(y, 2) for y in paper["y"]] == [1.0, 0.6, 0.4, 0.8]
    assert traces["this host"]["x"] == [1, 2, 4]
    assert [round(y, 3) for y in traces["this host"]["y"]] == [1.0, 0.583, 0.75]
    assert fig["layout"]["xaxis"]["title"]["text"] == "threads"
    assert "shapes, not seconds" in fig["layout"]["title"]["text"]


def test_the_hosts_view_cut_to_the_studys_cells(site: Path) -> None:
    dom = parse(site / "study-A6.html")
    host = dom.find("div", id="host")
    headers, rows = rows_of(host, "threads-table")  # the thread_sweep view, as on threads.html
    assert [main_text(r[headers.index("threads")]).split()[0] for r in rows] == ["1", "2", "4"]
    assert host.find("div", id="fig-threads")
    link = host.find("a", **{"class": "download"})
    assert link.attrs["href"] == "study-A6-thread_sweep.csv"
    assert len(read_csv(site / "study-A6-thread_sweep.csv")) == 3
    # the B7-evil study has no view: it gets the baseline of its own two cells
    evil = parse(site / "study-B7-evil.html").find("div", id="host")
    assert evil.find("section", id="baseline")
    assert (site / "study-B7-evil-baseline.csv").exists()
    assert len(read_csv(site / "study-B7-evil-baseline.csv")) == 2


def test_csv_files_of_every_study_table(site: Path, warehouse: Path) -> None:
    findings = read_csv(site / "study-A6-findings.csv")
    view = [r for r in findings_rows(warehouse) if r["study"] == "A6"]
    assert [r["finding"] for r in findings] == [r["finding"] for r in view]
    assert findings[0]["verdict"] == "reproduced" and findings[0]["observed"] == view[0]["observed"]
    assert [(r["config"], r["config_label"]) for r in findings] == [(r["config"], r["config_label"]) for r in view]
    paper = read_csv(site / "study-A6-paper.csv")
    assert [r["ratio"] for r in paper] == ["1.0", "0.6", "0.4", "0.8"]
    shapes = read_csv(site / "study-A6-shapes.csv")
    assert [(r["source"], r["x"], r["ratio"]) for r in shapes][3:] == [
        ("paper", "8", "0.8"), ("host", "1", "1.0"), ("host", "2", "0.5833333333333334"), ("host", "4", "0.75")]
    host = read_csv(site / "study-A6-host.csv")
    assert [(r["cell_id"], r["x"], r["metric"], r["matched"]) for r in host] == [
        ("t1", "1", "60.0", "true"), ("t2", "2", "35.0", "true"), ("t4", "4", "45.0", "true")]
    index = read_csv(site / "findings.csv")
    assert {r["study"] for r in index} == {"A6", "B7-evil"}  # not C1: it has no page


def test_the_index_opens_with_the_verdict_table_of_every_study(site: Path, warehouse: Path) -> None:
    dom = parse(site / "index.html")
    first = next(c for c in dom.find("main").children if isinstance(c, Node))
    assert first.tag == "section" and first.attrs.get("id") == "studies"
    headers, rows = rows_of(dom, "index-verdicts-table")
    assert headers == ["study", "finding", "configuration", "verdict", "observed"]
    summary = [(r[0].find("a").attrs["href"], r[0].find("b").text(), r[1].find("code").text(),
                badges(r[3])[0]) for r in rows]
    assert summary == [
        ("study-A6.html", "A6", "oversubscription", ("reproduced", "flag sig")),
        ("study-A6.html", "A6", "slower-with-threads", ("contradicted", "flag bad")),
        ("study-B7-evil.html", "B7-evil", "evil", ("reproduced", "flag sig")),  # 60 s -> 35 s
    ]
    assert rows[0][0].text() == "A6 BLAS thread count"
    assert rows[0][4].text() and "img/s" in rows[0][4].text()
    labels = {(r["study"], r["finding"]): r["config_label"] for r in findings_rows(warehouse)}
    assert [r[2].text() for r in rows] == [labels[("A6", "oversubscription")], labels[("A6", "slower-with-threads")],
                                           labels[("B7-evil", "evil")]]
    assert dom.find("div", **{"class": "cards"})  # what the index showed before follows


def test_hostile_study_texts_are_shown_only_as_text(site: Path) -> None:
    page = site / "study-B7-evil.html"
    dom = parse(page)
    raw = page.read_text(encoding="utf-8")
    assert "<script>window.__xss" not in raw and "<img" not in raw and "<svg" not in raw
    assert not dom.find_all("img") and not dom.find_all("svg") and not dom.find_all("i")
    for node in dom.iter():
        assert not any(k.startswith("on") for k in node.attrs), node.tag
    for script in dom.find_all("script"):  # only plotly.js and the figures' own scripts
        assert script.attrs.get("src") == "assets/plotly.min.js" or \
            script.text().startswith("(function () { var fig = "), script.text()[:80]
    text = dom.text()
    assert XSS_TITLE in dom.find("title").text() and XSS_TITLE in text
    assert XSS_CLAIM in text and XSS_NOTE in text and "<script>alert(1)</script>" in text
    assert FORMULA_CELL in text and XSS_COLUMN in text
    # on the index too
    index = parse(site / "index.html")
    assert not index.find_all("img") and XSS_TITLE in index.text() and XSS_CLAIM in index.text()
    # the figure's names and titles are escaped for Plotly (it would draw <b> as bold)
    fig = figure_spec(dom, "fig-paper-ratios")
    assert "Table &lt;script&gt;" in fig["layout"]["title"]["text"]
    # formulas in the CSV files are neutralised
    paper = read_csv(site / "study-B7-evil-paper.csv")
    assert paper[0][XSS_COLUMN] == "'" + FORMULA_CELL
    assert list(paper[0])[0] == XSS_COLUMN


def test_a_warehouse_without_studies_builds_as_before(tmp_path: Path) -> None:
    write_bundles(tmp_path / "results")
    path = tmp_path / "plain.duckdb"
    ingest([tmp_path / "results"], warehouse=path)
    site = build_report(warehouse=path, out_dir=tmp_path / "site").parent
    assert not list(site.glob("study-*")) and not (site / "findings.csv").exists()
    dom = parse(site / "index.html")
    assert not dom.find_all("section", id="studies")
    assert (site / "threads.html").exists()


def test_catalogue_of_a_database_without_its_tables_is_empty() -> None:
    con = duckdb.connect(":memory:")
    catalogue = read_catalogue(con)
    assert catalogue.studies.is_empty() and catalogue.findings.is_empty() and catalogue.cells.is_empty()


def test_a_one_sweep_report_and_publishing_keep_the_study_pages(warehouse: Path, tmp_path: Path) -> None:
    index = build_report(warehouse=warehouse, out_dir=tmp_path / "pub", sweep=SWEEP, publish=True)
    site = index.parent
    assert (site / "study-A6.html").exists()
    text = (site / "study-A6.html").read_text(encoding="utf-8")
    assert str(tmp_path) not in text and "A6-threads.toml" in text  # the matrix by name only


# --- the pure parts, on hand-made frames -----------------------------------------------------


def _paper(**changes: Any) -> sp.Paper:
    base = dict(source="Table II", note="", x="batch_size", metric="throughput",
                columns=("framework", "batch_size", "throughput"),
                rows=(("Caffe", 64, 100.0), ("Caffe", 128, 150.0), ("Torch", 64, 80.0), ("Torch", 128, 40.0)))
    return sp.Paper(**{**base, **changes})  # type: ignore[arg-type]


def test_paper_rows_are_ratios_within_each_series() -> None:
    rows = sp.paper_rows(_paper())
    assert [(r.series, r.ratio, r.base) for r in rows] == [
        ("Caffe", 1.0, 64), ("Caffe", 1.5, 64), ("Torch", 1.0, 64), ("Torch", 0.5, 64)]
    # a text value (a footnote) has no ratio; the series' base is its first number
    rows = sp.paper_rows(_paper(rows=(("Caffe", 64, "230 (800)"), ("Caffe", 128, 50.0), ("Caffe", 256, 25.0))))
    assert [r.ratio for r in rows] == [None, 1.0, 0.5]


def _levels(*cells: tuple[str, dict[str, Any], float | None, int]) -> pl.DataFrame:
    return pl.DataFrame({
        "cell_id": [c[0] for c in cells], "params": [json.dumps(c[1]) for c in cells],
        "throughput_median": [c[2] for c in cells], "runs": [c[3] for c in cells],
        "framework": [c[1].get("framework") for c in cells],
    })


def test_host_rows_match_the_papers_x_and_divide_by_the_first_matched_row() -> None:
    levels = _levels(
        ("c32", {"framework": "torch", "batch_size": 32, "lr": 0.1}, 50.0, 3),
        ("c64", {"framework": "torch", "batch_size": 64, "lr": 0.1}, 100.0, 3),
        ("c128", {"framework": "torch", "batch_size": 128, "lr": 0.1}, 120.0, 3),
        ("m64", {"framework": "mxnet", "batch_size": 64, "lr": 0.1}, 10.0, 3),
        ("m128", {"framework": "mxnet", "batch_size": 128, "lr": 0.1}, None, 0),
    )
    rows = sp.host_rows(levels, _paper(), x="batch_size", metric="throughput")
    assert [(r.cell_id, r.series, r.matched, r.ratio, r.base) for r in rows] == [
        ("c32", "torch", False, 0.5, 64), ("c64", "torch", True, 1.0, 64), ("c128", "torch", True, 1.2, 64),
        ("m64", "mxnet", True, 1.0, 64), ("m128", "mxnet", True, None, 64)]
    table = sp.host_table(_paper(), rows, csv_href="x.csv")
    assert "no batch_size=32 in the paper" in table and 'class="unmatched"' in table
    fig = sp.ratio_figure(_paper(), sp.paper_rows(_paper()), rows)
    assert fig is not None
    assert [t.name for t in fig.data] == ["paper · Caffe", "paper · Torch", "this host · torch", "this host · mxnet"]
    assert fig.layout.xaxis.type is None or fig.layout.xaxis.type == "linear"
    # step_s is seconds per image
    assert sp.metric_value({"throughput_median": 200.0}, "step_s") == 0.005


def test_x_values_match_however_they_are_written() -> None:
    assert sp.match_key(4) == sp.match_key(4.0) == sp.match_key("4") == "4"
    assert sp.match_key(0.01) == sp.match_key("0.01")
    assert sp.match_key("unset") == sp.match_key("Unset") != sp.match_key("4")


def test_only_reproduced_and_contradicted_are_coloured() -> None:
    assert 'class="flag sig"' in sp.finding_badge("reproduced")
    assert 'class="flag bad"' in sp.finding_badge("contradicted")
    for verdict in ("not significant", "not enough data", None, "<b>odd</b>"):
        badge = sp.finding_badge(verdict)
        assert 'class="flag muted"' in badge and "<b>" not in badge


def test_unreadable_paper_json_gives_no_paper_table() -> None:
    assert sp.parse_paper(None) is None and sp.parse_paper("{not json") is None
    assert sp.parse_paper('["a"]') is None and sp.parse_paper('{"columns": "a", "rows": []}') is None
    paper = sp.parse_paper('{"source": "T", "columns": ["a", "b"], "rows": [[1], [1, 2, 3], "x"]}')
    assert paper is not None and paper.rows == ((1, None), (1, 2), (None, None)) and paper.x is None
    assert sp.ratio_figure(paper, sp.paper_rows(paper), []) is None


def test_study_files_and_order() -> None:
    studies = pl.DataFrame({"study": ["A10", "A6", "B1", "demo", "A6/x"], "title": ["t"] * 5,
                            "paper": [None] * 5})
    cells = pl.DataFrame({"study": ["A10", "A6", "B1", "demo", "A6/x"], "profile": ["quick"] * 5,
                          "cell_id": ["c1", "c2", "c3", "c4", "gone"]})
    infos = sp.present_studies(studies, cells, ["c1", "c2", "c3", "c4"])
    assert [(i.id, i.file) for i in infos] == [
        ("A6", "study-A6.html"), ("A10", "study-A10.html"), ("B1", "study-B1.html"), ("demo", "study-demo.html")]
    assert sp.safe_name("A6/../x") == "A6____x"
    assert sp.present_studies(pl.DataFrame(), pl.DataFrame(), ["c1"]) == []


# --- in a real browser (tests/test_report_browser.py's client) --------------------------------


def test_study_pages_render_in_a_real_browser(site: Path, tmp_path: Path) -> None:
    from test_report_browser import FIGURE_CHECK, Browser, _chromium, _problems

    executable = _chromium()
    profile = tmp_path / "profile"
    profile.mkdir()
    browser = Browser(executable, profile)
    seen: dict[str, dict[str, Any]] = {}
    try:
        session = browser.open_page()
        for name in ("index.html", "study-A6.html", "study-B7-evil.html"):
            browser.load(session, (site / name).as_uri())
            state = browser.evaluate(session, FIGURE_CHECK)
            seen[name] = {**state, "problems": _problems(browser.events)}
    finally:
        browser.close()
    for name, state in seen.items():
        assert not state["problems"], (name, state["problems"])
        assert state["drawn"] == state["figures"], (name, state["figures"], state["drawn"])
        assert state["xss"] == "undefined" and state["images"] == 0 and state["inlineHandlers"] == 0, name
    assert "fig-paper-ratios" in seen["study-A6.html"]["drawn"]
    assert "fig-threads" in seen["study-A6.html"]["drawn"]
    assert XSS_TITLE in seen["study-B7-evil.html"]["text"] and XSS_CLAIM in seen["index.html"]["text"]


def test_the_base_is_the_smallest_x_and_texts_keep_the_papers_order() -> None:
    # A7: the paper lists 2560 epochs before 256; the ratio is to the smaller
    rows = sp.paper_rows(_paper(x="epochs", metric="train_s", columns=("framework", "epochs", "train_s"),
                                rows=(("TF", 2560, 219169.14), ("TF", 256, 21673.81))))
    assert [(r.base, round(r.ratio, 2)) for r in rows] == [(256, 10.11), (256, 1.0)]
    # a text x (a layout) keeps the paper's order: the first row is the base
    layout = _paper(x="layout", metric="throughput", columns=("framework", "layout", "throughput"),
                    rows=(("TF", "nhwc", 1.0), ("TF", "nchw", 1.15)))
    assert [r.ratio for r in sp.paper_rows(layout)] == [1.0, 1.15]
    levels = _levels(("a", {"framework": "torch", "layout": "nchw"}, 230.0, 3),
                     ("b", {"framework": "torch", "layout": "nhwc"}, 200.0, 3))
    host = sp.host_rows(levels, layout, x="layout", metric="throughput")
    assert [(r.x, r.ratio, r.base) for r in host] == [("nhwc", 1.0, "nhwc"), ("nchw", 1.15, "nhwc")]
    # numbers first, then texts (threads "unset" last)
    assert sorted([4, "unset", 1, "2"], key=lambda v: sp.x_order(v)) == [1, "2", 4, "unset"]


def test_parameters_zipped_with_x_do_not_split_the_hosts_series() -> None:
    levels = _levels(("b50", {"framework": "torch", "batch_size": 50, "lr": 0.01}, 100.0, 3),
                     ("b500", {"framework": "torch", "batch_size": 500, "lr": 0.05}, 300.0, 3),
                     ("m50", {"framework": "mxnet", "batch_size": 50, "lr": 0.01}, 50.0, 3),
                     ("m500", {"framework": "mxnet", "batch_size": 500, "lr": 0.05}, 75.0, 3))
    rows = sp.host_rows(levels, _paper(), x="batch_size", metric="throughput")
    assert [(r.series, r.ratio) for r in rows] == [("torch", 1.0), ("torch", 3.0), ("mxnet", 1.0), ("mxnet", 1.5)]
    assert rows[0].series_keys == ("framework",)


def test_a_view_cut_to_a_studys_cells_keeps_their_references() -> None:
    from matrun.reports.data import cut_to_cells

    frame = pl.DataFrame({"config": ["k", "k", "k", "j", "j"], "cell_id": ["r", "s", "o", "r2", "t"],
                          "ref_cell_id": ["r", "r", "r", "r2", "r2"]})
    cut = cut_to_cells("thread_sweep", frame, ["s"])
    assert cut.get_column("cell_id").to_list() == ["r", "s"]  # its reference, not the other cell
    assert cut_to_cells("thread_sweep", frame, []).is_empty()
    best = pl.DataFrame({"default_cell_id": ["d", "e"], "best_cell_id": ["b", "f"]})
    assert cut_to_cells("best_vs_default", best, ["f"]).get_column("default_cell_id").to_list() == ["e"]
