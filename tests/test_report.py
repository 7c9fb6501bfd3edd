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
"""

from __future__ import annotations

import json
import statistics
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Iterator

import plotly.graph_objects as go
import polars as pl
import pytest

from bundle_factory import make_bundle, read_json
from matrun.errors import InputError
from matrun.reports import build_report
from matrun.reports import data as reads
from matrun.reports.figures import epoch_figure, monitor_figure, throughput_figure
from matrun.reports.pages import MARKER, plotly_js_source, script_json
from matrun.reports.shape import cell_labels, choose_run
from matrun.runner.bundle import write_json_atomic
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest

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
    headers, rows, _ = table_rows(parse(fixture_site), "baseline-table")
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
    dom = parse(fixture_site)
    headers, rows, trs = table_rows(dom, "baseline-table")
    b = next(i for i, r in enumerate(rows) if cell(r, headers, "threads").text() == "2")
    assert "mismatch" in trs[b].classes()
    assert "mismatch in 1 run(s)" in cell(rows[b], headers, "flags").text()
    assert "< 3 runs" in cell(rows[b], headers, "flags").text()
    baseline = dom.find("section", id="baseline").text()
    assert "threads=4 — failed ×1" in baseline


# --- figures, plotly.js, escaping -------------------------------------------------------


def test_figure_divs_exist_and_are_drawn(fixture_site: Path) -> None:
    dom = parse(fixture_site)
    for div_id in ("fig-throughput", "fig-epochs", "fig-monitor"):
        assert "figure" in dom.find("div", id=div_id).classes()
        assert figure_spec(dom, div_id)["data"], div_id
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
    dom = parse(fixture_site)
    sources = [s.attrs["src"] for s in dom.find_all("script") if s.attrs.get("src")]
    assert sources == ["assets/plotly.min.js"]
    copies = [p for p in site.rglob("*.js")]
    assert copies == [site / "assets" / "plotly.min.js"]
    assert copies[0].read_bytes() == plotly_js_source().read_bytes()
    stylesheets = [link.attrs["href"] for link in dom.find_all("link")]
    assert stylesheets == ["assets/report.css"] and (site / "assets" / "report.css").is_file()
    html_text = fixture_site.read_text(encoding="utf-8")
    assert "cdn.plot.ly" not in html_text and "https://" not in html_text


def test_hostile_labels_appear_only_escaped(all_site: Path) -> None:
    dom = parse(all_site)
    scripts = dom.find_all("script")
    inline = [s for s in scripts if not s.attrs.get("src")]
    assert len(inline) == 3 and all(s.text().startswith("(function () { var fig =") for s in inline)
    assert not dom.find_all("img") and not dom.find_all("pre", class_="tail")[0].find_all("script")
    assert not [n for n in dom.iter() if any(k.startswith("on") for k in n.attrs)]
    page_text = dom.find("main").text()
    for hostile in (XSS_MODEL, XSS_SWEEP, XSS_HOST, XSS_TAIL):
        assert hostile in page_text  # shown to the reader as text
    raw = all_site.read_text(encoding="utf-8")
    assert "<script>alert" not in raw and "<img" not in raw and "<b>evil" not in raw
    # Inside the figure JSON no "<" survives; Plotly gets the label as entities.
    bars = figure_spec(dom, "fig-throughput")["data"][0]
    assert any("&lt;/script&gt;&lt;script&gt;alert(1)" in y for y in bars["y"])
    assert all("<" not in s.text() for s in inline)


def test_script_json_escapes_what_could_close_a_script() -> None:
    text = json.dumps({"label": "</script><!-- & \u2028"})
    safe = script_json(text)
    assert "<" not in safe and ">" not in safe and "&" not in safe and "\u2028" not in safe
    assert json.loads(safe) == json.loads(text)


def test_failed_run_shows_its_error_tail_escaped(fixture_site: Path) -> None:
    dom = parse(fixture_site)
    headers, rows, trs = table_rows(dom, "runs-table")
    failed = next(i for i, r in enumerate(rows) if cell(r, headers, "run id").text().startswith(C))
    assert "failed" in trs[failed].classes()
    assert cell(rows[failed], headers, "status").text() == "failed"
    tails = dom.find_all("pre", class_="tail")
    assert [t.text() for t in tails] == [XSS_TAIL]
    assert not tails[0].find_all("script")


# --- provenance -------------------------------------------------------------------------


def test_provenance_shows_hosts_versions_and_highlights_mismatches(all_site: Path) -> None:
    dom = parse(all_site)
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
    dom = parse(fixture_site)
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
    dom = parse(index)
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
    headers, rows, _ = table_rows(parse(fixture_site), "runs-table")
    assert len(rows) == 6 and not any(cell(r, headers, "run id").text().startswith(D) for r in rows)
    headers, rows, _ = table_rows(parse(all_site), "runs-table")
    assert len(rows) == 7
    base_headers, base_rows, _ = table_rows(parse(all_site), "baseline-table")
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
