"""The static report, built from a real warehouse of fixture bundles and read back as HTML.

Sweep ``fixture``; every expected number is worked out by hand from the bundles below.

Cell A (threads 1, lenet5), three ok runs:

    run   timed steps (s)   throughput   epoch_s     train s  test acc  test s  cpu usr/sys  rss MiB avg / peak
    0-1   0.01, 0.01        6400         10, 10      20       .80       1.0     100 / 10     200 / 300
    1-1   0.02, 0.02        3200         11, 11      22       .82       1.5     200 / 10     300 / 400
    2-1   0.03, 0.03        2133.33      15, 15      30       .78       2.0     100 / 10     200 / 250

    medians: train 22 (20-30), test 1.5, accuracy 80.00% (78-82), throughput 3200
    (2133.3-6400), CPU total 110 (usr 100, sys 10), memory 200.0 / 400.0 MiB (median of
    averages / highest peak), 3 runs.

Cell B (threads 2, model ``</script><script>alert(1)</script>``): two ok runs, the second
with a thread mismatch; it holds the latest ok run.  Cell C (threads 4): one failed run,
started last, whose error tail is hostile HTML.  Sweep ``<img src=x onerror=alert(2)>``:
cell D (threads 8) on host ``<b>evil-host</b>``, one ok run.

The site has a page per section with data (reports/site.py); the study sections are tested
on the warehouse of tests/report_fixture.py, which has rows in every study view.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Iterator

import plotly.graph_objects as go
import polars as pl
import pytest

from bundle_factory import make_bundle, read_json
from matrun.errors import InputError
from matrun.reports import data as reads
from matrun.reports.build import (PublishLeak, build_report, check_no_local_paths, local_paths,
                                  read_report_data)
from matrun.reports.data import STUDY_VIEWS
from matrun.reports.figures import epoch_figure, monitor_figure, throughput_figure
from matrun.reports.pages import MARKER, csv_value, plotly_js_source, script_json
from matrun.reports.shape import cell_labels, choose_run, mask_paths
from matrun.reports.site import BUILDERS, PAGES, VIEW_PAGES, Context
from matrun.reports.study_figures import phase_order
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query
from report_fixture import (FORMULA, TAIL_FORMULA, XSS_ATTR, XSS_HOSTNAME, XSS_LIB, XSS_SCRIPT,
                            build_study_warehouse)

MiB = 2**20
A, B, C, D = "a000000000000001", "b000000000000002", "c000000000000003", "d000000000000004"
XSS_MODEL = "</script><script>alert(1)</script>"
XSS_SWEEP = "<img src=x onerror=alert(2)>"
XSS_HOST = "<b>evil-host</b>"
XSS_TAIL = "Traceback (most recent call last):\nRuntimeError: </pre><script>alert(3)</script> & done"
THROUGHPUTS_A = [64 / 0.01, 64 / 0.02, 64 / 0.03]


def _epochs(epoch_s: float, acc: float, test_s: float) -> tuple[dict[str, float], ...]:
    return (
        {"train_loss": 1.0, "train_accuracy": 0.6, "test_loss": 0.8, "test_accuracy": 0.7,
         "epoch_seconds": epoch_s, "test_seconds": test_s},
        {"train_loss": 0.5, "train_accuracy": 0.8, "test_loss": 0.6, "test_accuracy": acc,
         "epoch_seconds": epoch_s, "test_seconds": test_s},
    )


def _started(run_dir: Path, minute: int) -> None:
    """Give a run its own start time (the factory writes the same one for every run)."""
    result = read_json(run_dir / "result.json")
    result["started_at"] = f"2026-11-22T01:{minute:02d}:00+00:00"
    write_json_atomic(run_dir / "result.json", result)


def _fixture_bundles(results: Path) -> None:
    a_runs = [  # (step seconds, epoch s, accuracy, test s, monitor)
        (0.01, 10.0, 0.80, 1.0, ((0.2, 90.0, 10.0, 0.0, 100 * MiB), (0.4, 110.0, 10.0, 0.0, 300 * MiB))),
        (0.02, 11.0, 0.82, 1.5, ((0.2, 190.0, 10.0, 0.0, 200 * MiB), (0.4, 210.0, 10.0, 0.0, 400 * MiB))),
        (0.03, 15.0, 0.78, 2.0, ((0.2, 90.0, 10.0, 0.0, 150 * MiB), (0.4, 110.0, 10.0, 0.0, 250 * MiB))),
    ]
    for repeat, (step, epoch_s, acc, test_s, monitor) in enumerate(a_runs):
        run = make_bundle(results, cell_id=A, repeat=repeat, params={"threads": 1},
                          step_seconds=(0.02, 0.02, step, step),
                          epochs=_epochs(epoch_s, acc, test_s), monitor=monitor)
        _started(run, repeat)
    for repeat in range(2):
        run = make_bundle(results, cell_id=B, repeat=repeat,
                          params={"threads": 2, "model": XSS_MODEL},
                          mismatches=["threads: asked 2, in force 1"] if repeat else (),
                          monitor=((1.0 + repeat, 150.0, 5.0, 0.0, 50 * MiB),
                                   (2.0 + repeat, 160.0, 5.0, 0.0, 60 * MiB)))
        _started(run, 10 + repeat)
    failed = make_bundle(results, cell_id=C, params={"threads": 4}, status="failed",
                         exit_code=1, error_tail=XSS_TAIL)
    _started(failed, 20)
    other = make_bundle(results, sweep=XSS_SWEEP, cell_id=D, params={"threads": 8},
                        hostname=XSS_HOST)
    _started(other, 5)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    _fixture_bundles(root / "results")
    path = root / "matrun.duckdb"
    report = ingest([root / "results"], warehouse=path)
    assert len(report.ingested) == 7 and not report.skipped, report
    return path


@pytest.fixture(scope="module")
def fixture_site(warehouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "report"
    return build_report(warehouse=warehouse, out_dir=out, sweep="fixture")


@pytest.fixture(scope="module")
def all_site(warehouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site-all") / "report"
    return build_report(warehouse=warehouse, out_dir=out)


# --- a small DOM from the standard library's parser -------------------------------------

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "source", "track", "wbr"})


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None]) -> None:
        self.tag, self.attrs = tag, attrs
        self.children: list[Node | str] = []

    def iter(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str, **attrs: str) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag
                and all(n.attrs.get(k.rstrip("_")) == v for k, v in attrs.items())]

    def find(self, tag: str, **attrs: str) -> Node:
        found = self.find_all(tag, **attrs)
        assert found, f"no <{tag} {attrs}>"
        return found[0]

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class DomBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(index: Path) -> Node:
    builder = DomBuilder()
    builder.feed(index.read_text(encoding="utf-8"))
    builder.close()
    return builder.root


def page(index: Path, name: str) -> Node:
    """The parsed page ``name`` of the site whose front page is ``index``."""
    return parse(index.parent / name)


def table_rows(dom: Node, table_id: str) -> tuple[list[str], list[list[Node]], list[Node]]:
    """(header texts, data rows as lists of <td>, the <tr> nodes) of a table."""
    table = dom.find("table", id=table_id)
    headers = [th.text() for th in table.find_all("th")]
    trs = [tr for tr in table.find("tbody").find_all("tr") if "tail-row" not in tr.classes()]
    return headers, [tr.find_all("td") for tr in trs], trs


def figure_spec(dom: Node, div_id: str) -> dict[str, Any]:
    """The figure JSON that the inline script after ``div_id`` draws."""
    for script in dom.find_all("script"):
        body = script.text()
        if f'Plotly.newPlot("{div_id}"' in body:
            start = body.index("var fig = ") + len("var fig = ")
            end = body.index(";\nPlotly.newPlot")
            return json.loads(body[start:end])
    raise AssertionError(f"no script draws {div_id}")


def cell(row: list[Node], headers: list[str], name: str) -> Node:
    return row[headers.index(name)]


def main_and_sub(td: Node) -> tuple[str, str]:
    spans = td.find_all("span")
    main = next(s.text() for s in spans if "n" in s.classes())
    sub = next((s.text() for s in spans if "sub" in s.classes()), "")
    return main, sub


# --- the baseline table -----------------------------------------------------------------


def test_baseline_table_has_the_hand_computed_medians(fixture_site: Path) -> None:
    headers, rows, _ = table_rows(page(fixture_site, "baseline.html"), "baseline-table")
    assert headers[:2] == ["model", "threads"]  # the parameters that vary, nothing else
    by_threads = {cell(r, headers, "threads").text(): r for r in rows}
    assert set(by_threads) == {"1", "2"}  # cell C never succeeded: not in the baseline
    a = by_threads["1"]
    cv = statistics.stdev(THROUGHPUTS_A) / statistics.mean(THROUGHPUTS_A)
    assert cell(a, headers, "runs").text() == "3"
    assert main_and_sub(cell(a, headers, "train s")) == ("22.00", "20.00–30.00")
    assert main_and_sub(cell(a, headers, "test s")) == ("1.50", "")
    assert main_and_sub(cell(a, headers, "accuracy")) == ("80.00%", "78.00%–82.00%")
    assert main_and_sub(cell(a, headers, "throughput (images/s)")) == (
        "3,200.0", f"2,133.3–6,400.0 · CV {100 * cv:.1f}%")
    assert main_and_sub(cell(a, headers, "CPU %")) == ("110", "usr 100 · sys 10 · io 0.0")
    assert main_and_sub(cell(a, headers, "memory MiB avg / peak")) == ("200.0 / 400.0", "")
    assert "noisy" in cell(a, headers, "flags").text()  # CV ~ 57%


def test_baseline_flags_mismatches_and_lists_cells_without_success(fixture_site: Path) -> None:
    dom = page(fixture_site, "baseline.html")
    headers, rows, trs = table_rows(dom, "baseline-table")
    b = next(i for i, r in enumerate(rows) if cell(r, headers, "threads").text() == "2")
    assert "mismatch" in trs[b].classes()
    assert "mismatch in 1 run(s)" in cell(rows[b], headers, "flags").text()
    assert "< 3 runs" in cell(rows[b], headers, "flags").text()
    baseline = dom.find("section", id="baseline").text()
    assert "threads=4 — failed ×1" in baseline


def test_a_language_model_has_tokens_per_second_and_perplexity_in_the_baseline(tmp_path: Path) -> None:
    """A sweep with a language model shows its tokens/s and perplexity beside the throughput
    (sequences/s); the CNN's row has none; a sweep without one has no such columns."""
    results = tmp_path / "results"
    lm = {"model": "gpt-tiny", "dataset": "synthetic-text", "layout": None}
    for repeat, (rate, ppl) in enumerate([(10.0, 3.50), (12.0, 3.60), (11.0, 3.40)]):
        make_bundle(results, sweep="lm", cell_id="aaaa000000000001", repeat=repeat, params=lm, throughput=rate,
                    summary_extra={"seq_len": 64, "tokens_per_second": rate * 64, "perplexity": ppl})
    make_bundle(results, sweep="lm", cell_id="bbbb000000000002", throughput=500.0)
    make_bundle(results, sweep="cnn", cell_id="cccc000000000003", throughput=500.0)
    ingest([results], warehouse=tmp_path / "w.duckdb")
    site = build_report(warehouse=tmp_path / "w.duckdb", out_dir=tmp_path / "lm", sweep="lm")
    headers, rows, _ = table_rows(page(site, "baseline.html"), "baseline-table")
    assert "throughput (images or sequences/s)" in headers
    by_model = {cell(r, headers, "model").text(): r for r in rows}
    gpt, cnn = by_model["gpt-tiny"], by_model["lenet5"]
    assert main_and_sub(cell(gpt, headers, "tokens/s")) == ("704", "")
    assert main_and_sub(cell(gpt, headers, "perplexity")) == ("3.500", "3.400–3.600")
    assert main_and_sub(cell(cnn, headers, "tokens/s")) == ("–", "")
    site = build_report(warehouse=tmp_path / "w.duckdb", out_dir=tmp_path / "cnn", sweep="cnn")
    headers, _, _ = table_rows(page(site, "baseline.html"), "baseline-table")
    assert "tokens/s" not in headers and "throughput (images/s)" in headers


# --- figures, plotly.js, escaping -------------------------------------------------------


def test_figure_divs_exist_and_are_drawn(fixture_site: Path) -> None:
    dom = page(fixture_site, "baseline.html")
    for div_id in ("fig-throughput", "fig-epochs"):
        assert "figure" in dom.find("div", id=div_id).classes()
        assert figure_spec(dom, div_id)["data"], div_id
    runs_page = page(fixture_site, "runs.html")
    assert "figure" in runs_page.find("div", id="fig-monitor").classes()
    assert figure_spec(runs_page, "fig-monitor")["data"]
    bars = figure_spec(dom, "fig-throughput")["data"][0]
    a = bars["y"].index("lenet5 · threads=1")
    assert bars["x"][a] == pytest.approx(3200.0)  # cell A's median, min-max as error bars
    assert bars["error_x"]["array"][a] == pytest.approx(6400.0 - 3200.0)
    assert bars["error_x"]["arrayminus"][a] == pytest.approx(3200.0 - 64 / 0.03)
    assert bars["x"][1 - a] == pytest.approx(6400.0)  # cell B: default steps of 0.01 s
    epochs = {(t["name"], t["xaxis"]): t for t in figure_spec(dom, "fig-epochs")["data"]}
    assert len(epochs) == 4  # accuracy and epoch seconds for cells A and B
    accuracy = epochs[("lenet5 · threads=1", "x")]
    assert accuracy["x"] == [1, 2] and accuracy["y"] == pytest.approx([0.7, 0.8])
    assert epochs[("lenet5 · threads=1", "x2")]["y"] == pytest.approx([11.0, 11.0])


def test_plotly_js_is_one_local_relative_copy(fixture_site: Path) -> None:
    site = fixture_site.parent
    for html_page in site.glob("*.html"):
        dom = parse(html_page)
        sources = [s.attrs["src"] for s in dom.find_all("script") if s.attrs.get("src")]
        assert sources == ["assets/plotly.min.js"], html_page.name
        stylesheets = [link.attrs["href"] for link in dom.find_all("link")]
        assert stylesheets == ["assets/report.css"], html_page.name
        html_text = html_page.read_text(encoding="utf-8")
        assert "cdn.plot.ly" not in html_text and "https://" not in html_text
    copies = [p for p in site.rglob("*.js")]
    assert copies == [site / "assets" / "plotly.min.js"]
    assert copies[0].read_bytes() == plotly_js_source().read_bytes()
    assert (site / "assets" / "report.css").is_file()


def test_hostile_labels_appear_only_escaped(all_site: Path) -> None:
    page_text = ""
    for html_page in sorted(all_site.parent.glob("*.html")):
        dom = parse(html_page)
        inline = [s for s in dom.find_all("script") if not s.attrs.get("src")]
        assert all(s.text().startswith("(function () { var fig =") for s in inline), html_page.name
        assert all("<" not in s.text() for s in inline)
        assert not dom.find_all("img") and not [b for b in dom.find_all("b") if b.text() == "evil-host"]
        for tail in dom.find_all("pre", class_="tail"):
            assert not tail.find_all("script")
        assert not [n for n in dom.iter() if any(k.startswith("on") for k in n.attrs)]
        page_text += dom.find("main").text() + dom.find("header").text()
        raw = html_page.read_text(encoding="utf-8")
        assert "<script>alert" not in raw and "<img" not in raw and "<b>evil" not in raw
    for hostile in (XSS_MODEL, XSS_SWEEP, XSS_HOST, XSS_TAIL):
        assert hostile in page_text  # shown to the reader as text
    # Inside the figure JSON no "<" survives; Plotly gets the label as entities.
    bars = figure_spec(page(all_site, "baseline.html"), "fig-throughput")["data"][0]
    assert any("&lt;/script&gt;&lt;script&gt;alert(1)" in y for y in bars["y"])


def test_script_json_escapes_what_could_close_a_script() -> None:
    text = json.dumps({"label": "</script><!-- & \u2028"})
    safe = script_json(text)
    assert "<" not in safe and ">" not in safe and "&" not in safe and "\u2028" not in safe
    assert json.loads(safe) == json.loads(text)


def test_failed_run_shows_its_error_tail_escaped(fixture_site: Path) -> None:
    dom = page(fixture_site, "runs.html")
    headers, rows, trs = table_rows(dom, "runs-table")
    failed = next(i for i, r in enumerate(rows) if cell(r, headers, "run id").text().startswith(C))
    assert "failed" in trs[failed].classes()
    assert cell(rows[failed], headers, "status").text() == "failed"
    tails = dom.find_all("pre", class_="tail")
    assert [t.text() for t in tails] == [XSS_TAIL]
    assert not tails[0].find_all("script")


# --- provenance -------------------------------------------------------------------------


def test_provenance_shows_hosts_versions_and_highlights_mismatches(all_site: Path) -> None:
    dom = page(all_site, "provenance.html")
    section = dom.find("section", id="provenance")
    text = section.text()
    for expected in ("fixture-host", XSS_HOST, "Fixture CPU", "3.11.7", "0.1.0",
                     "2.13.0+cpu", "torch-cpu-0123456789ab", "libgomp", "/lib/libgomp.so.1"):
        assert expected in text, expected
    assert "2 different host setups" in text
    headers, rows, trs = table_rows(dom, "in-force-table")
    flagged = [r for r, tr in zip(rows, trs) if "mismatch" in tr.classes()]
    assert len(flagged) == 1
    assert cell(flagged[0], headers, "mismatches").text() == "⚠ threads: asked 2, in force 1"
    assert cell(flagged[0], headers, "threads asked → in force").text() == "2 → 2"
    assert "1 run(s) in 1 cell(s) did not get what they asked for" in text


# --- which run the monitor figure shows -------------------------------------------------


def _visible_x(dom: Node) -> list[list[float]]:
    return [t["x"] for t in figure_spec(dom, "fig-monitor")["data"] if t.get("visible")]


def test_monitor_defaults_to_the_latest_ok_run(fixture_site: Path) -> None:
    dom = page(fixture_site, "runs.html")
    visible = _visible_x(dom)
    assert len(visible) == 4 and visible[0] == [2.0, 3.0]  # cell B, repeat 1
    headers, rows, trs = table_rows(dom, "runs-table")
    selected = [cell(r, headers, "run id").text() for r, tr in zip(rows, trs)
                if "selected" in tr.classes()]
    assert selected == [f"{B}/1-1 shown above"]
    menu = figure_spec(dom, "fig-monitor")["layout"]["updatemenus"][0]
    assert len(menu["buttons"]) == 6 and menu["active"] == 0  # every run of the sweep
    assert f"Showing run {B}/1-1" in dom.find("section", id="monitor").text()


def test_run_id_picks_the_monitor_run(warehouse: Path, tmp_path: Path) -> None:
    index = build_report(warehouse=warehouse, out_dir=tmp_path / "r", run_id=f"{A}/1-1")
    dom = page(index, "runs.html")
    assert _visible_x(dom)[0] == [0.2, 0.4]
    assert f"Showing run {A}/1-1" in dom.find("section", id="monitor").text()
    rss = [t for t in figure_spec(dom, "fig-monitor")["data"] if t.get("visible")][-1]["y"]
    assert rss == pytest.approx([200.0, 400.0])  # MiB


def test_unknown_run_id_or_sweep_is_an_input_error(warehouse: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"run 'nope/0-1' is not in the report's runs"):
        build_report(warehouse=warehouse, out_dir=tmp_path / "r", run_id="nope/0-1")
    with pytest.raises(InputError) as info:
        build_report(warehouse=warehouse, out_dir=tmp_path / "r", sweep="missing")
    assert str(info.value) == (
        f"sweep 'missing' has no runs in the warehouse; its sweeps are: {XSS_SWEEP}, fixture")
    assert not (tmp_path / "r").exists()


def test_sweep_filters_the_report(fixture_site: Path, all_site: Path) -> None:
    headers, rows, _ = table_rows(page(fixture_site, "runs.html"), "runs-table")
    assert len(rows) == 6 and not any(cell(r, headers, "run id").text().startswith(D) for r in rows)
    headers, rows, _ = table_rows(page(all_site, "runs.html"), "runs-table")
    assert len(rows) == 7
    base_headers, base_rows, _ = table_rows(page(all_site, "baseline.html"), "baseline-table")
    assert base_headers[0] == "sweep"
    assert sorted(cell(r, base_headers, "sweep").text() for r in base_rows) == [
        XSS_SWEEP, "fixture", "fixture"]


# --- empty warehouse, output directory ----------------------------------------------------


def test_empty_warehouse_gives_a_no_runs_page(tmp_path: Path) -> None:
    path = tmp_path / "empty.duckdb"
    with open_warehouse(path):
        pass
    index = build_report(warehouse=path, out_dir=tmp_path / "site")
    dom = parse(index)
    assert "No runs yet in the warehouse." in dom.find("section", id="empty").text()
    assert not dom.find_all("div", class_="figure")
    assert (tmp_path / "site" / "assets" / "plotly.min.js").is_file()
    # No section has rows: the front page alone, no CSV, no page links
    files = sorted(str(p.relative_to(tmp_path / "site")) for p in (tmp_path / "site").rglob("*"))
    assert files == [MARKER, "assets", "assets/plotly.min.js", "assets/report.css", "index.html"]
    assert not dom.find("nav", class_="pages").find_all("a")
    published = build_report(warehouse=path, out_dir=tmp_path / "public", publish=True)
    assert "No runs yet" in published.read_text(encoding="utf-8")


def test_rebuild_replaces_a_report_but_never_another_directory(warehouse: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    build_report(warehouse=warehouse, out_dir=out, sweep="fixture")
    (out / "stale.html").write_text("old", encoding="utf-8")
    build_report(warehouse=warehouse, out_dir=out, sweep="fixture")
    assert not (out / "stale.html").exists() and (out / MARKER).is_file()
    before = (out / "index.html").read_bytes()
    with pytest.raises(InputError):
        build_report(warehouse=warehouse, out_dir=out, run_id="nope/0-1")
    assert (out / "index.html").read_bytes() == before  # a failed build changes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no temporary left over
    foreign = tmp_path / "docs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(InputError, match="exists and is not a matrun report"):
        build_report(warehouse=warehouse, out_dir=foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


# --- the data layer -----------------------------------------------------------------------


def test_monitor_samples_are_downsampled_keeping_the_memory_peak(tmp_path: Path) -> None:
    samples = [(0.1 * i, 100.0, 5.0, 0.0, (900 if i == 777 else 100) * MiB) for i in range(1234)]
    make_bundle(tmp_path / "results", monitor=samples)
    path = tmp_path / "w.duckdb"
    ingest([tmp_path / "results"], warehouse=path)
    with open_warehouse(path, read_only=True) as wh:
        frame = reads.read_monitor(wh.con, ["c0ffee0000000001/0-1"], max_points=500)
        none = reads.read_monitor(wh.con, ["no/0-1"])
    assert 400 < frame.height <= 500
    assert frame.get_column("rss_bytes").max() == 900 * MiB
    assert frame.get_column("t").to_list()[0] == 0.0
    assert frame.get_column("t").is_sorted()
    assert frame.get_column("cpu_user").to_list() == pytest.approx([100.0] * frame.height)
    assert none.is_empty()


# --- pure pieces: shaping and figure builders ---------------------------------------------


def _runs(**columns: list[Any]) -> pl.DataFrame:
    n = len(next(iter(columns.values())))
    base: dict[str, list[Any]] = {
        "sweep": ["s"] * n, "cell_id": [f"c{i}" for i in range(n)],
        "run_id": [f"c{i}/0-1" for i in range(n)], "status": ["ok"] * n,
        "started_at": list(range(n)), "framework": ["torch"] * n, "model": ["lenet5"] * n,
        "dataset": ["mnist"] * n, "threads": ["1"] * n, "batch_size": [64] * n,
    }
    return pl.DataFrame({**base, **columns})


def test_cell_labels_name_what_varies_and_stay_unique() -> None:
    labels = cell_labels(_runs(threads=["1", "2", "2"], batch_size=[32, 64, 64]))
    assert labels.get_column("label").to_list() == [
        "threads=1 · batch_size=32", "threads=2 · batch_size=64 (c1)",
        "threads=2 · batch_size=64 (c2)"]
    single = cell_labels(_runs(threads=["1"]))
    assert single.get_column("label").to_list() == ["torch · lenet5 · mnist"]


def test_choose_run_prefers_the_latest_ok_run() -> None:
    runs = _runs(status=["ok", "ok", "failed"])
    assert choose_run(runs, None) == "c1/0-1"
    assert choose_run(runs, "c2/0-1") == "c2/0-1"
    assert choose_run(_runs(status=["failed", "timeout"]), None) == "c1/0-1"
    assert choose_run(runs.clear(), None) is None


def test_throughput_figure_draws_medians_with_min_max_bars() -> None:
    frame = pl.DataFrame({
        "label": ["a", "<b>"], "throughput_median": [100.0, 50.0],
        "throughput_min": [90.0, 50.0], "throughput_max": [130.0, 60.0],
        "throughput_cv": [0.1, None], "runs": [3, 1],
    })
    fig = throughput_figure(frame)
    assert isinstance(fig, go.Figure)
    bar = fig.data[0]
    assert list(bar.x) == [100.0, 50.0] and list(bar.y) == ["a", "&lt;b&gt;"]
    assert list(bar.error_x.array) == [30.0, 10.0]
    assert list(bar.error_x.arrayminus) == [10.0, 0.0]
    empty = throughput_figure(frame.clear())
    assert not empty.data and "No cell" in empty.layout.annotations[0].text


def test_epoch_figure_has_accuracy_and_time_panels_per_cell() -> None:
    frame = pl.DataFrame({
        "label": ["a", "a", "b"], "epoch": [0, 1, 0],
        "test_accuracy_median": [0.5, 0.6, 0.7], "test_accuracy_min": [0.4, 0.6, 0.7],
        "test_accuracy_max": [0.55, 0.65, 0.7], "epoch_seconds_median": [3.0, 4.0, 5.0],
    })
    fig = epoch_figure(frame, {"a": "#111111", "b": "#222222"})
    assert [(t.name, t.xaxis) for t in fig.data] == [("a", "x"), ("a", "x2"), ("b", "x"), ("b", "x2")]
    assert list(fig.data[0].x) == [1, 2] and list(fig.data[1].y) == [3.0, 4.0]
    assert fig.data[0].line.color == fig.data[1].line.color == "#111111"
    assert list(fig.data[0].error_y.array) == pytest.approx([0.05, 0.05])


def test_monitor_figure_switches_runs_with_a_menu() -> None:
    samples = pl.DataFrame({
        "run_id": ["r1", "r1", "r2"], "t": [0.0, 1.0, 0.5],
        "cpu_user": [100.0, 120.0, 50.0], "cpu_system": [5.0, 5.0, 1.0],
        "iowait": [0.0, 0.0, 0.0], "rss_bytes": [MiB, 2 * MiB, 3 * MiB],
    })
    fig = monitor_figure(samples, [("r2", "run two"), ("r1", "run one")], "r2")
    assert len(fig.data) == 8
    assert [t.visible for t in fig.data] == [True] * 4 + [False] * 4
    assert list(fig.data[3].y) == [3.0]  # RSS in MiB
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["run two", "run one"]
    assert buttons[1].args[0]["visible"] == [False] * 4 + [True] * 4
    single = monitor_figure(samples, [("r1", "run one")], "r1")
    assert not single.layout.updatemenus and len(single.data) == 4


def test_labels_of_a_broad_sweep_name_only_the_uncommon_values() -> None:
    # Five parameters vary: past four, a label shows a value only where it is not the most
    # common one, and stays unique.
    runs = _runs(threads=["1", "2", "1", "1"], batch_size=[64, 64, 128, 64],
                 model=["lenet5", "lenet5", "lenet5", "alexnet"],
                 dataset=["mnist", "mnist", "mnist", "cifar10"], framework=["torch"] * 3 + ["mxnet"],
                 optimizer=["sgd", "sgd", "sgd", "adam"])
    labels = cell_labels(runs).get_column("label").to_list()
    assert labels == ["torch · lenet5 · mnist", "torch · lenet5 · mnist · threads=2",
                      "torch · lenet5 · mnist · batch_size=128",
                      "mxnet · alexnet · cifar10 · optimizer=adam"]


def test_mask_paths_keeps_the_last_part_only() -> None:
    text = 'File "/home/alice/results/s/c/0-1/harness.py", line 3 in /usr/lib/libgomp.so.1; ' \
           "https://example.org/a/b stays, a/b/c stays, 3/4 stays"
    assert mask_paths(text) == ('File "…/harness.py", line 3 in …/libgomp.so.1; '
                                "https://example.org/a/b stays, a/b/c stays, 3/4 stays")


# --- the site: a page per section with data ------------------------------------------------

STUDY_PAGES = {"index.html", "baseline.html", "libraries.html", "threads.html", "epochs.html",
               "batch.html", "batch-lr.html", "scaling.html", "convergence.html", "layers.html",
               "iterations.html", "options.html", "pareto.html", "provenance.html", "runs.html"}


@pytest.fixture(scope="module")
def study_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_study_warehouse(tmp_path_factory.mktemp("study"))


@pytest.fixture(scope="module")
def study_site(study_warehouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_report(warehouse=study_warehouse, out_dir=tmp_path_factory.mktemp("study-site") / "r")


def html_pages(index: Path) -> set[str]:
    return {p.name for p in index.parent.glob("*.html")}


def test_pages_exist_only_for_sections_with_data(study_site: Path, fixture_site: Path,
                                                 tmp_path: Path) -> None:
    assert html_pages(study_site) == STUDY_PAGES  # a row in every study view
    # Sweep "fixture": a thread comparison (A and C, with D of the other sweep), no batch,
    # epochs, library, option, scaling or layer comparison
    assert html_pages(fixture_site) == {"index.html", "baseline.html", "threads.html",
                                        "convergence.html", "pareto.html", "provenance.html",
                                        "runs.html"}
    nav = [a.attrs["href"] for a in parse(fixture_site).find("nav", class_="pages").find_all("a")]
    assert nav == ["index.html", "baseline.html", "threads.html", "convergence.html",
                   "pareto.html", "provenance.html", "runs.html"]
    # Only failed runs: no baseline, no study page, the runs and where they ran
    make_bundle(tmp_path / "results", status="failed", exit_code=1, error_tail="boom")
    ingest([tmp_path / "results"], warehouse=tmp_path / "w.duckdb")
    index = build_report(warehouse=tmp_path / "w.duckdb", out_dir=tmp_path / "site")
    assert html_pages(index) == {"index.html", "provenance.html", "runs.html"}
    assert "No cell has a successful run yet" in parse(index).find("main").text()


def test_every_page_links_the_others_relatively(study_site: Path) -> None:
    site = study_site.parent
    # every page but "Across releases": the fixture's runs have one framework release
    # (tests/test_history.py draws that page)
    expected = ["index.html", *[spec.file for spec in PAGES if spec.file != "releases.html"]]
    assert not (site / "releases.html").exists()
    for name in STUDY_PAGES:
        dom = parse(site / name)
        links = dom.find("nav", class_="pages").find_all("a")
        assert [a.attrs["href"] for a in links] == expected, name
        current = [a.attrs["href"] for a in links if a.attrs.get("aria-current") == "page"]
        assert current == [name]
        ids = {n.attrs["id"] for n in dom.iter() if n.attrs.get("id")}
        for node in dom.iter():
            for attr in ("href", "src"):
                target = node.attrs.get(attr)
                if target is None:
                    continue
                assert "://" not in target and not target.startswith(("/", "..")), (name, target)
                if target.startswith("#"):
                    assert target[1:] in ids, (name, target)
                else:
                    assert (site / target.split("#")[0]).is_file(), (name, target)


def _csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_csv_downloads_match_the_view_rows(study_warehouse: Path, study_site: Path) -> None:
    site = study_site.parent
    linked = {a.attrs["href"] for name in STUDY_PAGES
              for a in parse(site / name).find_all("a", class_="download")}
    for view in [*STUDY_VIEWS, "baseline", "epoch_curve", "provenance"]:
        columns, rows = run_query(f"SELECT * FROM {view}", warehouse=study_warehouse)
        assert rows, view  # the fixture has rows in every view
        header, body = _csv(site / f"{view}.csv")
        assert header == columns, view
        assert len(body) == len(rows), view
        assert f"{view}.csv" in linked, view
        if "cell_id" in columns:
            i = columns.index("cell_id")
            assert sorted(r[i] for r in body) == sorted("" if r[i] is None else str(r[i]) for r in rows), view
    # Numbers are written as numbers, exactly
    columns, rows = run_query("SELECT cell_id, throughput_median, significant FROM thread_sweep",
                              warehouse=study_warehouse)
    header, body = _csv(site / "thread_sweep.csv")
    got = {r[header.index("cell_id")]: (r[header.index("throughput_median")], r[header.index("significant")])
           for r in body}
    for cell_id, median, significant in rows:
        text, sig = got[cell_id]
        assert (float(text) if text else None) == median
        assert sig == {True: "true", False: "false", None: ""}[significant]
    header, body = _csv(site / "runs.csv")
    assert len(body) == run_query("SELECT count(*) FROM runs", warehouse=study_warehouse)[1][0][0]
    assert "error_tail" in header


def test_csv_cells_that_look_like_formulas_are_neutralised(study_site: Path) -> None:
    site = study_site.parent
    header, body = _csv(site / "thread_sweep.csv")
    evil = [r for r in body if r[header.index("cell_id")].startswith("evil-")]
    assert evil and all(r[header.index("dataset")] == "'" + FORMULA for r in evil)
    header, body = _csv(site / "runs.csv")
    tails = [r[header.index("error_tail")] for r in body if r[header.index("status")] == "failed"]
    assert [t.splitlines()[0] for t in tails] == ["'" + TAIL_FORMULA]
    for path in site.glob("*.csv"):
        for row in _csv(path)[1]:
            for value in row:
                assert not value.startswith(("=", "+", "@", "\t", "\r")), (path.name, value)
                if value.startswith("-") and value != "-":
                    float(value)  # a negative number, kept as a number
    header, body = _csv(site / "option_effect.csv")
    assert any(float(r[header.index("accuracy_change")]) < 0 for r in body)  # oneDNN off: -0.75
    assert [csv_value(v) for v in ("=1+2", "+1", "-1", "@A1", "\tx", "\rx", "plain", -1.5, None, True)] == [
        "'=1+2", "'+1", "'-1", "'@A1", "'\tx", "'\rx", "plain", "-1.5", "", "true"]


def test_study_pages_show_hostile_text_only_as_text(study_site: Path) -> None:
    site = study_site.parent
    texts = {}
    for name in sorted(STUDY_PAGES):
        dom = parse(site / name)
        raw = (site / name).read_text(encoding="utf-8")
        assert "<script>alert" not in raw and "<img" not in raw and "<svg" not in raw, name
        assert not dom.find_all("img") and not dom.find_all("svg"), name
        assert not [n for n in dom.iter() if any(k.startswith("on") for k in n.attrs)], name
        inline = [s for s in dom.find_all("script") if not s.attrs.get("src")]
        assert all(s.text().startswith("(function () { var fig =") for s in inline), name
        assert all("<" not in s.text() for s in inline), name
        texts[name] = dom.find("main").text()
    assert XSS_SCRIPT in texts["baseline.html"] and XSS_ATTR in texts["baseline.html"]
    assert XSS_HOSTNAME in texts["provenance.html"] and XSS_LIB in texts["provenance.html"]
    assert XSS_SCRIPT in texts["runs.html"] and XSS_ATTR in texts["runs.html"]  # the error tail
    assert XSS_SCRIPT in texts["threads.html"] and XSS_SCRIPT in texts["pareto.html"]
    legend = [t["name"] for t in figure_spec(parse(site / "threads.html"), "fig-threads")["data"]]
    assert any("&lt;script&gt;alert(1)&lt;/script&gt;" in n for n in legend)


# The label of the study fixture's thread sweep at batch 64 (configurations differ in model,
# dataset and batch size).
BATCH_64 = "torch · lenet5 · fashion-mnist · batch_size=64"


def _verdicts(dom: Node, table_id: str) -> list[str]:
    headers, rows, _ = table_rows(dom, table_id)
    return [next((s.text() for s in cell(r, headers, "verdict").find_all("span")
                  if "flag" in s.classes()), "–") for r in rows]


def test_verdicts_are_never_worded_as_wins_without_significance(study_warehouse: Path,
                                                                 study_site: Path) -> None:
    site = study_site.parent
    for view, page_name, table_id in (
            ("thread_sweep", "threads.html", "threads-table"),
            ("library_comparison", "libraries.html", "libraries-table"),
            ("batch_sweep", "batch.html", "batch-table"),
            ("worker_scaling", "scaling.html", "scaling-table"),
            ("option_effect", "options.html", "options-table"),
            ("best_vs_default", "baseline.html", "best-table")):
        order = reads.STUDY_VIEWS[view].order
        columns, rows = run_query(f"SELECT verdict, significant FROM {view} ORDER BY {order}",
                                  warehouse=study_warehouse)
        badges = _verdicts(parse(site / page_name), table_id)
        assert len(badges) == len(rows), view
        for badge, (verdict, significant) in zip(badges, rows):
            if badge in ("faster", "slower"):
                assert significant is True and badge == verdict, (view, badge, verdict)
            elif verdict not in ("reference", "default is fastest", None):
                assert badge == "not significant" and not significant, (view, badge, verdict)
    # threads 4 vs 1 at batch 64, 4 runs each, all faster: exact p = 2/70; the throughput ratio
    # 304.5 / 104.5 with its Hodges-Lehmann interval, at 4 against 4 the smallest and largest
    # pairwise ratio: 300 / 109 and 309 / 100
    headers, rows, _ = table_rows(parse(site / "threads.html"), "threads-table")
    four = next(r for r in rows if cell(r, headers, "threads").text().startswith("4")
                and cell(r, headers, "configuration").text() == BATCH_64)
    assert cell(four, headers, "verdict").text() == (
        "fasterimg/s ×2.91 (2.75–3.09) · p = 0.0286 · mann-whitney exact")
    # ×3 on the GPU with one run against one: shown, but grey and "not significant"
    best = figure_spec(parse(site / "baseline.html"), "fig-best")["data"][1]
    gpu = next(i for i, x in enumerate(best["x"]) if "resnet18" in x)
    assert best["marker"]["color"][gpu] == "#8c95a6" and "not significant" in best["text"][gpu]


def test_medians_carry_their_intervals(study_site: Path) -> None:
    dom = parse(study_site.parent / "threads.html")
    headers, rows, _ = table_rows(dom, "threads-table")
    one = next(r for r in rows if cell(r, headers, "threads").text() == "1"
               and cell(r, headers, "configuration").text() == BATCH_64)
    # throughputs 100, 103, 106, 109: median 104.5, [min, max] covers the median 87.5 %
    assert main_and_sub(cell(one, headers, "images/s")) == (
        "104.5", "range 100.0–109.0 (n=4, 87.5% coverage)")
    trace = next(t for t in figure_spec(dom, "fig-threads")["data"]
                 if t["name"] == BATCH_64 and t["xaxis"] == "x")
    i = trace["x"].index("1")
    assert trace["y"][i] == pytest.approx(104.5)
    assert trace["error_y"]["array"][i] == pytest.approx(4.5)
    assert trace["error_y"]["arrayminus"][i] == pytest.approx(4.5)


def test_a_sweep_report_keeps_the_reference_another_sweep_ran(fixture_site: Path) -> None:
    header, body = _csv(fixture_site.parent / "thread_sweep.csv")
    assert sorted(r[header.index("cell_id")] for r in body) == [A, C, D]
    assert {r[header.index("ref_cell_id")] for r in body} == {A}


# --- publishing ------------------------------------------------------------------------------


# --- where the time goes (iterations.html; tests/report_fixture.py write_phase_bundles) ---------

ONE_WORKER = "lenet5 · synthetic · cpu · 1 thread(s) · batch 64 · 1 worker"


def _bars(fig: dict[str, Any]) -> dict[str, list[tuple[str, float, dict[str, Any]]]]:
    """Per bar (y label): its stacked segments in drawing order, (name, ms, trace)."""
    out: dict[str, list[tuple[str, float, dict[str, Any]]]] = {}
    for trace in fig["data"]:
        if trace["type"] == "bar":
            out.setdefault(trace["y"][0], []).append((trace["name"], trace["x"][0], trace))
    return out


def test_the_time_page_stacks_each_cells_phases_and_the_rest(study_site: Path) -> None:
    dom = parse(study_site.parent / "iterations.html")
    fig = figure_spec(dom, "fig-phases-0")
    assert fig["layout"]["title"]["text"] == f"Where a step's time goes — {ONE_WORKER}"
    assert fig["layout"]["barmode"] == "stack"
    bars = _bars(fig)
    assert list(bars) == ["jax", "torch"]  # the 2-worker and the hostile cell have their own figures
    # torch: forward 4, backward 6, update 1 ms of a 12 ms sampled step; 1 ms in no phase
    torch = bars["torch"]
    assert [(n, pytest.approx(ms)) for n, ms, _ in torch] == [
        ("forward", 4.0), ("backward", 6.0), ("update", 1.0), ("in no phase", 1.0)]
    assert sum(ms for _, ms, _ in torch) == pytest.approx(12.0)  # the bar is the sampled step
    assert all("pattern" not in t["marker"] for _, _, t in torch)
    # jax runs its step as one program: named together, hatched; its phases take 8.1 ms of an
    # 8 ms step, so "in no phase" is drawn as 0 and its hover keeps -0.1 ms
    (fused, fused_ms, fused_trace), (gap, gap_ms, gap_trace) = bars["jax"]
    assert (fused, fused_ms) == ("forward+backward+update (fused)", pytest.approx(8.1))
    assert fused_trace["marker"]["pattern"]["shape"] == "/"
    assert (gap, gap_ms) == ("in no phase", 0.0)
    assert gap_trace["customdata"][0][0] == pytest.approx(-0.1)
    # one legend entry per phase, in the order phases run; the same colour in every figure
    entries = [t for t in fig["data"] if t.get("showlegend") is not False]
    assert [t["name"] for t in sorted(entries, key=lambda t: t["legendrank"])] == [
        "forward+backward+update (fused)", "forward", "backward", "update", "in no phase",
        "sampled step (median)", "unsampled step (median: the throughput's)"]
    two = _bars(figure_spec(dom, "fig-phases-2"))
    assert [(n, pytest.approx(ms)) for n, ms, _ in two["torch"]] == [
        ("forward", 4.4), ("backward", 6.0), ("exchange", 4.0), ("update", 1.0), ("in no phase", 1.1)]
    colour = {n: t["marker"]["color"] for b in (bars, two) for segs in b.values() for n, _, t in segs}
    assert colour["forward"] == torch[0][2]["marker"]["color"] and len(set(colour.values())) == len(colour)
    markers = {t["name"]: t["x"] for t in fig["data"] if t["type"] == "scatter"}
    assert markers["sampled step (median)"] == pytest.approx([8.0, 12.0])
    assert markers["unsampled step (median: the throughput's)"] == pytest.approx([8.0, 10.0])
    # the hostile cell's model is a title, as text
    hostile = figure_spec(dom, "fig-phases-1")["layout"]["title"]["text"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile and "<script>" not in hostile


def test_the_time_page_tables_one_row_per_cell(study_site: Path) -> None:
    dom = parse(study_site.parent / "iterations.html")
    lead = dom.find("section", id="iterations").find("p", class_="lead").text()
    assert "docs/MODEL.md" in lead
    headers, rows, _ = table_rows(dom, "iterations-table")
    assert len(rows) == 4  # ph-jax, ph-evil, ph-torch, ph-torch-w2
    by = {(cell(r, headers, "framework").text(), cell(r, headers, "workers").text(),
           "alert" in cell(r, headers, "cell").text()): r for r in rows}
    torch = by[("torch", "1", False)]
    assert main_and_sub(cell(torch, headers, "step ms")) == ("10.000", "sampled 12.000")
    assert cell(torch, headers, "phases (ms, in order)").text() == "forward 4.000 · backward 6.000 · update 1.000"
    assert cell(torch, headers, "bottleneck").text() == "backward"
    assert cell(torch, headers, "its share").text() == "50.0%"
    assert cell(torch, headers, "fused").text() == "no"
    assert main_and_sub(cell(torch, headers, "in no phase")) == ("8.3%", "1.0000 ms")
    assert cell(torch, headers, "sampling cost").text() == "+20.0%"
    assert cell(torch, headers, "gradient bytes").text() == "2,000,000"
    jax = by[("jax", "1", False)]
    assert cell(jax, headers, "fused").text() == "yes"
    assert cell(jax, headers, "its share").text() == "101.2%"
    assert main_and_sub(cell(jax, headers, "in no phase")) == ("-1.2%", "-0.1000 ms")
    assert cell(by[("torch", "2", False)], headers, "its share").text() == "36.4%"  # 6 of 16.5 ms
    assert XSS_SCRIPT in cell(by[("torch", "1", True)], headers, "cell").text()
    # The CSV is the view's: a row per cell and phase, the negative gap kept as a number
    header, body = _csv(study_site.parent / "iteration_model.csv")
    jax_rows = [r for r in body if r[header.index("cell_id")] == "ph-jax"]
    assert len(body) == 11 and len(jax_rows) == 1
    assert float(jax_rows[0][header.index("gap_s")]) == pytest.approx(-0.0001)


def test_the_time_page_sets_the_predicted_speedup_beside_the_measured(study_site: Path) -> None:
    dom = parse(study_site.parent / "iterations.html")
    traces = {t["name"]: t for t in figure_spec(dom, "fig-iteration-scaling")["data"]}
    assert traces["linear (y = workers)"]["x"] == [1, 2] and traces["linear (y = workers)"]["y"] == [1, 2]
    measured = next(t for n, t in traces.items() if n.endswith("· measured"))
    predicted = next(t for n, t in traces.items() if n.endswith("· predicted"))
    # reference 10 ms at 64 images; 2 workers: 10 ms compute + 0.5 ms + 2 MB at 1 GB/s exposed
    # = 12.5 ms for 128 images: x1.6 predicted; measured 8000 / 6400 images/s: x1.25
    assert measured["x"] == [1, 2] and measured["y"] == pytest.approx([1.0, 1.25])
    assert predicted["y"] == pytest.approx([1.0, 1.6])
    assert predicted["marker"]["symbol"].endswith("-open") and predicted["line"]["dash"] == "dot"
    assert "-open" not in measured["marker"]["symbol"]
    headers, rows, _ = table_rows(dom, "iteration-scaling-table")
    assert len(rows) == 1
    got = {h: main_and_sub(td)[0] if td.find_all("span") else td.text() for h, td in zip(headers, rows[0])}
    assert {h: got[h] for h in ("framework", "model", "workers", "pattern", "transport", "latency ms",
                                "bandwidth MB/s", "exchange ms", "exposed ms", "predicted step ms",
                                "measured step ms", "predicted speedup", "speedup", "prediction error",
                                "forward ÷ 1 worker")} == {
        "framework": "torch", "model": "lenet5", "workers": "2", "pattern": "ring all-reduce",
        "transport": "gloo", "latency ms": "0.500", "bandwidth MB/s": "1,000.0", "exchange ms": "2.500",
        "exposed ms": "2.500", "predicted step ms": "12.500", "measured step ms": "16.000",
        "predicted speedup": "×1.60", "speedup": "×1.25", "prediction error": "+28.0%",
        "forward ÷ 1 worker": "×1.10"}  # 4.4 ms forward at 2 workers, 4 ms at 1
    assert [a.attrs["href"] for a in dom.find_all("a", class_="download")] == [
        "iteration_model.csv", "iteration_scaling.csv"]


def test_the_time_page_is_absent_without_phases_and_its_scaling_without_a_prediction(
        study_warehouse: Path) -> None:
    with open_warehouse(study_warehouse, read_only=True) as wh:
        report = read_report_data(wh.con)
    ctx = Context(report=report, labels=cell_labels(report.runs), colors={}, levels={})
    build = BUILDERS["iterations.html"]
    full = build(ctx)
    assert full is not None and set(full.csv) == {"iteration_model.csv", "iteration_scaling.csv"}
    assert [a for a, _ in full.anchors] == ["iterations", "iteration-scaling"]
    alone = build(replace(ctx, report=replace(report, studies={**report.studies,
                                                               "iteration_scaling": pl.DataFrame()})))
    assert alone is not None and set(alone.csv) == {"iteration_model.csv"}
    assert [a for a, _ in alone.anchors] == ["iterations"] and 'id="iteration-scaling"' not in alone.body
    assert build(replace(ctx, report=replace(report, studies={**report.studies,
                                                              "iteration_model": pl.DataFrame()}))) is None
    assert VIEW_PAGES["iteration_model"] == VIEW_PAGES["iteration_scaling"] == "iterations.html"


def test_phases_are_ordered_as_they_run_across_cells() -> None:
    frame = pl.DataFrame({"cell_id": ["a", "a", "a", "b", "b", "b", "b", "c"],
                          "ordinal": [0, 1, 2, 3, 0, 2, 1, 0],
                          "phase": ["forward", "backward", "update", "update", "forward", "exchange",
                                    "backward", "forward+backward+update"]})
    # exchange (cell b only) before update (both): each cell's order kept, by ordinal
    assert phase_order(frame) == ["forward", "forward+backward+update", "backward", "exchange", "update"]
    # cells that disagree (a cycle) keep the order first seen
    cycle = pl.DataFrame({"cell_id": ["a", "a", "b", "b"], "ordinal": [0, 1, 0, 1],
                          "phase": ["forward", "update", "update", "forward"]})
    assert phase_order(cycle) == ["forward", "update"]
    assert phase_order(cycle.clear()) == []


def test_publish_writes_a_copy_without_local_paths(study_warehouse: Path, tmp_path: Path) -> None:
    results = study_warehouse.parent / "results"
    local = build_report(warehouse=study_warehouse, out_dir=tmp_path / "local")
    assert str(results) in (local.parent / "runs.html").read_text(encoding="utf-8")  # the tail
    published = build_report(warehouse=study_warehouse, out_dir=tmp_path / "public", publish=True)
    site = published.parent
    assert html_pages(published) == STUDY_PAGES
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".csv", ".css"):
            text = path.read_text(encoding="utf-8")
            for secret in (str(results), str(study_warehouse), str(tmp_path), "/opt/secret"):
                assert secret not in text, (path.name, secret)
    runs_text = parse(site / "runs.html").find("main").text()
    assert 'File "…/harness.py", line 1' in runs_text
    assert "…/<b>libx</b>.so" in parse(site / "provenance.html").find("main").text()
    assert "study.duckdb" not in published.read_text(encoding="utf-8")
    assert (site / MARKER).is_file()


def test_publish_refuses_a_directory_that_is_not_a_report(warehouse: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "www"
    foreign.mkdir()
    (foreign / "index.html").write_text("my site", encoding="utf-8")
    with pytest.raises(InputError) as info:
        build_report(warehouse=warehouse, out_dir=foreign, publish=True)
    assert str(info.value) == (f"report directory {foreign} exists and is not a matrun report "
                               f"(no {MARKER} in it); choose a new or empty directory")
    assert [p.name for p in foreign.iterdir()] == ["index.html"]
    a_file = tmp_path / "file"
    a_file.write_text("x", encoding="utf-8")
    with pytest.raises(InputError, match="exists and is not a directory"):
        build_report(warehouse=warehouse, out_dir=a_file, publish=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    build_report(warehouse=warehouse, out_dir=empty, publish=True)
    build_report(warehouse=warehouse, out_dir=empty, publish=True)  # over its own report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "www"]


def test_publish_fails_rather_than_leak_a_local_path(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PublishLeak) as info:
        check_no_local_paths({"index.html": "ok", "runs.csv": "x,/srv/results/a/0-1,y"},
                             ["/srv/results"])
    assert str(info.value) == ("refusing to publish: runs.csv would contain the local path "
                               "/srv/results; nothing was written")
    # The current and home directories are in the list too, wherever the tests run from.
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    assert local_paths(warehouse=Path("/srv/w/m.duckdb"), out_dir=Path("/tmp/x"),
                       bundles=["/srv/w/results/s/c/0-1", "/srv/w/results/s/d/0-1"]) == sorted([
        "/srv/w", "/srv/w/m.duckdb", "/srv/w/results/s", "/srv/w/results/s/c/0-1",
        "/srv/w/results/s/d/0-1", "/tmp/x", str(cwd), str(home)])  # /tmp: too common


def test_cli_report_publish(warehouse: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from matrun.runner.cli.main import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["report", "--warehouse", str(warehouse), "--publish", "pub"])
    assert result.exit_code == 0, result.output
    assert result.output == f"published: {tmp_path / 'pub' / 'index.html'}\n"
    assert not (tmp_path / "report").exists()  # --publish alone writes only the public copy
    result = runner.invoke(app, ["report", "--warehouse", str(warehouse), "--out", "local",
                                 "--publish", "pub"])
    assert result.exit_code == 0 and (tmp_path / "local" / "runs.html").is_file()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x", encoding="utf-8")
    result = runner.invoke(app, ["report", "--warehouse", str(warehouse), "--publish", "notes"])
    assert result.exit_code == 2
    assert f"Error: report directory {tmp_path / 'notes'} exists and is not a matrun report" in result.output


def test_baseline_flags_throttled_and_busy_runs_and_shows_energy_only_when_measured(
        tmp_path: Path, fixture_site: Path) -> None:
    # The fixture's runs measured no energy: no energy column.
    headers, _, _ = table_rows(page(fixture_site, "baseline.html"), "baseline-table")
    assert "energy J / image" not in headers
    results = tmp_path / "results"
    for repeat in range(2):
        run = make_bundle(results, cell_id=A, repeat=repeat, params={"device": "gpu", "gpus": 1})
        result = read_json(run / "result.json")
        result["monitor"].update(gpu_energy_j=60.0 * (repeat + 1), gpu_throttled=bool(repeat),
                                 gpu_throttle_reasons=["hw_thermal_slowdown"] if repeat else [])
        result["host"]["state"] = {"busy": not repeat, "busy_reasons": ["other processes kept 0.90 …"]}
        write_json_atomic(run / "result.json", result)
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        for record in events:
            if record.get("type") == "summary":
                record["images"] = 600
        (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
    db = tmp_path / "wh.duckdb"
    assert len(ingest([results], warehouse=db).ingested) == 2
    site = build_report(warehouse=db, out_dir=tmp_path / "site")
    headers, rows, trs = table_rows(page(site, "baseline.html"), "baseline-table")
    flags = cell(rows[0], headers, "flags").text()
    assert "GPU throttled in 1 run(s)" in flags and "busy machine in 1 run(s)" in flags
    assert "mismatch" in trs[0].classes()
    assert cell(rows[0], headers, "energy J / image").text() == "0.1500"  # median of 0.1 and 0.2 J
