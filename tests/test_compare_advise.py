"""``matrun compare`` and ``matrun advise`` over hand-made warehouses.  Every expected number
is worked out by hand from the bundles below; no framework runs.

Each run has one epoch record, so its train s is that epoch's seconds and its accuracy that
epoch's test accuracy.  Runs per cell as (throughput, train s, accuracy).

Compare warehouse: a framework upgrade.  Sweep "old" ran in environment torch-cpu-old…,
sweep "new" the same parameters in torch-cpu-new… (so every cell id differs):

    threads  old (A)                                         new (B)
    1        100/20/.80 102/21/.80 104/22/.81 106/23/.81      200/10/.81 202/11/.81 204/12/.82
             108/24/.82                                       206/13/.82 208/14/.83, + one failed run
    2        150/15/.80 160/16/.80                            300/8/.80 310/9/.80
    4        400/5 410/5 420/5 530/5 (all .80)               300/6 310/6 320/6 330/6 (all .80)
    8        50/40/.80 (only in A)
    1, batch 128                                              500/4/.75 (only in B)

Advise warehouse (sweep "study" unless said otherwise; "default" = threads "unset", the
framework's own layout, preset none with its sgd / 0.01 / 64, so default_cells picks it):

    torch fashion-mnist   default   100 102 104 106 108 (all .80)   threads 2: 200 202 204 206 208 (.80)
    torch mnist           default   100 102 (.90)                   threads 2: 140 144 (.90)
    mxnet fashion-mnist   default   300 300 (.80)                   threads 1: 200 200 (.80)
    torch cifar10         default settings with epochs 1: 60/10/.50, and with epochs 2: 60/20/.60
    tensorflow f-mnist    (sweep "tfsweep") no default: threads 1 layout nchw 50 50 (.80);
                          threads 2 layout nhwc 80 80 (.80)
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Sequence

import pytest
from typer.testing import CliRunner

from lake_client import plain_writer
from matrun.warehouse.catalog import attach_sql, layout
from bundle_factory import make_bundle, read_json
from matrun.errors import InputError, QueryError
from matrun.runner.cli.main import app
from matrun.warehouse.advise import advise
from matrun.warehouse.compare import compare
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

OLD_ENV, NEW_ENV = "torch-cpu-old000000000", "torch-cpu-new000000000"


def _epoch(seconds: float, accuracy: float) -> dict[str, Any]:
    return {"train_loss": 0.5, "train_accuracy": accuracy, "test_loss": 0.5,
            "test_accuracy": accuracy, "epoch_seconds": seconds, "test_seconds": 1.0}


def _set_env(run_dir: Path, env_id: str) -> None:
    """Give a bundle another environment id (spec.json and result.json must agree)."""
    for name in ("spec.json", "result.json"):
        doc = read_json(run_dir / name)
        doc["env_id"] = env_id
        (run_dir / name).write_text(json.dumps(doc), encoding="utf-8")


def _cell(results: Path, sweep: str, cell_id: str, runs: Sequence[tuple[float, float, float]],
          params: dict[str, Any], env_id: str | None = None, **kwargs: Any) -> None:
    for repeat, (throughput, seconds, accuracy) in enumerate(runs):
        run = make_bundle(results, sweep=sweep, cell_id=cell_id, repeat=repeat, params=params,
                          throughput=throughput, epochs=(_epoch(seconds, accuracy),), **kwargs)
        if env_id:
            _set_env(run, env_id)


def _warehouse(results: Path) -> Path:
    path = results.parent / "matrun.duckdb"
    report = ingest([results], warehouse=path)
    assert not report.skipped, report.skipped
    return path


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("upgrade") / "results"
    t = lambda n, **more: {"threads": n, "epochs": 1, **more}  # noqa: E731
    _cell(results, "old", "old-t1", [(100, 20, .80), (102, 21, .80), (104, 22, .81), (106, 23, .81),
                                     (108, 24, .82)], t(1), OLD_ENV)
    _cell(results, "new", "new-t1", [(200, 10, .81), (202, 11, .81), (204, 12, .82), (206, 13, .82),
                                     (208, 14, .83)], t(1), NEW_ENV)
    failed = make_bundle(results, sweep="new", cell_id="new-t1", repeat=5, params=t(1),
                         status="failed", exit_code=1, error_tail="RuntimeError: boom")
    _set_env(failed, NEW_ENV)
    _cell(results, "old", "old-t2", [(150, 15, .80), (160, 16, .80)], t(2), OLD_ENV)
    _cell(results, "new", "new-t2", [(300, 8, .80), (310, 9, .80)], t(2), NEW_ENV)
    _cell(results, "old", "old-t4", [(400, 5, .80), (410, 5, .80), (420, 5, .80), (530, 5, .80)], t(4), OLD_ENV)
    _cell(results, "new", "new-t4", [(300, 6, .80), (310, 6, .80), (320, 6, .80), (330, 6, .80)], t(4), NEW_ENV)
    _cell(results, "old", "old-t8", [(50, 40, .80)], t(8), OLD_ENV)
    _cell(results, "new", "new-b128", [(500, 4, .75)], t(1, batch_size=128), NEW_ENV)
    return _warehouse(results)


def _by_label(result) -> dict[str, dict[str, Any]]:
    return {c["label"]: c for c in result.matched}


# -- compare: the numbers --------------------------------------------------------------------


def test_two_sweeps_are_matched_across_environments(upgrade: Path) -> None:
    result = compare("old", "sweep:new", warehouse=upgrade)
    assert (result.a.kind, result.a.value, len(result.a.run_ids)) == ("sweep", "old", 12)
    assert (result.b.kind, result.b.value, len(result.b.run_ids)) == ("sweep", "new", 13)  # + the failed run
    rows = _by_label(result)
    assert sorted(rows) == ["batch_size=64 threads=1", "batch_size=64 threads=2", "batch_size=64 threads=4"]
    t1 = rows["batch_size=64 threads=1"]
    assert (t1["a_cells"], t1["b_cells"]) == (["old-t1"], ["new-t1"])
    assert (t1["a_envs"], t1["b_envs"]) == ([OLD_ENV], [NEW_ENV])
    assert (t1["a_runs"], t1["b_runs"], t1["a_failed_runs"], t1["b_failed_runs"]) == (5, 5, 0, 1)


def test_a_clear_gain_with_five_repeats_is_significant(upgrade: Path) -> None:
    t1 = _by_label(compare("old", "new", warehouse=upgrade))["batch_size=64 threads=1"]
    assert (t1["a_throughput"], t1["b_throughput"]) == (104, 204)
    assert t1["throughput_ratio"] == pytest.approx(204 / 104)
    assert (t1["a_train_s"], t1["b_train_s"]) == (22, 12)
    assert t1["time_ratio"] == pytest.approx(12 / 22)
    assert t1["accuracy_change"] == pytest.approx(1.0)  # .82 - .81, in points
    # 5 runs: the interval is the range, with coverage 1 - 2^-4
    assert (t1["a_throughput_ci_low"], t1["a_throughput_ci_high"]) == (100, 108)
    assert t1["a_throughput_ci_level"] == pytest.approx(0.9375)
    # every B run beats every A run: exact two-sided p = 2 / C(10, 5)
    assert t1["p_value"] == pytest.approx(2 / 252)
    assert (t1["test"], t1["significant"], t1["verdict"]) == ("mann-whitney exact", True, "faster")
    # the ratio's Hodges-Lehmann interval, 5 against 5: P(U <= 2) = 4/252 <= 0.025 < P(U <= 3) =
    # 7/252, so the 3rd smallest and 3rd largest of the 25 ratios b / a: 200/106 (above 200/108
    # and 202/108) and 204/100 (below 208/100 and 206/100)
    assert (t1["throughput_ratio_low"], t1["throughput_ratio_high"], t1["throughput_ratio_level"]) == (
        pytest.approx(200 / 106), pytest.approx(204 / 100), pytest.approx(1 - 8 / 252))
    # throughput CV 0.030 (A) is quiet, but train s varies: sd sqrt(2.5) / 22 = 0.072 > 0.05
    assert t1["a_throughput_cv"] == pytest.approx(math.sqrt(10) / 104)
    assert t1["a_train_s_cv"] == pytest.approx(math.sqrt(2.5) / 22)
    assert (t1["a_noisy"], t1["b_noisy"]) == (True, True)


def test_two_repeats_per_side_are_never_significant(upgrade: Path) -> None:
    t2 = _by_label(compare("old", "new", warehouse=upgrade))["batch_size=64 threads=2"]
    assert t2["throughput_ratio"] == pytest.approx(305 / 155)  # about 2x, and still not significant
    assert t2["time_ratio"] == pytest.approx(8.5 / 15.5)
    assert t2["p_value"] == pytest.approx(1 / 3)  # 2 / C(4, 2)
    assert (t2["test"], t2["significant"], t2["verdict"]) == ("interval overlap", False, "not significant")


def test_a_significant_loss_and_the_noisy_flag(upgrade: Path) -> None:
    t4 = _by_label(compare("old", "new", warehouse=upgrade))["batch_size=64 threads=4"]
    assert (t4["a_throughput"], t4["b_throughput"]) == (415, 315)
    assert t4["throughput_ratio"] == pytest.approx(315 / 415)
    assert t4["time_ratio"] == pytest.approx(6 / 5)
    assert t4["p_value"] == pytest.approx(2 / 70)  # 2 / C(8, 4)
    assert (t4["significant"], t4["verdict"]) == (True, "slower")
    # A: mean 440, sample sd sqrt(11000 / 3): CV 0.138 > 0.05
    assert t4["a_throughput_cv"] == pytest.approx(math.sqrt(11000 / 3) / 440)
    assert (t4["a_noisy"], t4["b_noisy"]) == (True, False)
    assert t4["accuracy_change"] == pytest.approx(0.0)
    assert t4["accuracy_verdict"] == "not significant"


def test_unmatched_cells_are_listed_apart_and_summarised(upgrade: Path) -> None:
    result = compare("old", "new", warehouse=upgrade)
    assert [(c["label"], c["a_cells"], c["b_cells"]) for c in result.only_a] == \
        [("batch_size=64 threads=8", ["old-t8"], None)]
    assert [(c["label"], c["a_cells"], c["b_cells"]) for c in result.only_b] == \
        [("batch_size=128 threads=1", None, ["new-b128"])]
    assert result.only_a[0]["verdict"] is None
    assert result.summary() == ("3 matched cells, B against A: 1 faster, 1 slower, 1 not significant "
                                "(1 with too few repeats for the test to decide); 1 only in A, 1 only in B")


def test_sql_selections_take_only_the_runs_they_name(upgrade: Path) -> None:
    result = compare("sql:SELECT run_id FROM run_overview WHERE cell_id = 'old-t1' AND repeat < 2",
                     "sql: SELECT run_id, throughput FROM run_overview WHERE cell_id = 'new-t1' AND repeat >= 3",
                     warehouse=upgrade)
    assert (result.a.kind, len(result.a.run_ids), len(result.b.run_ids)) == ("sql", 2, 3)
    (row,) = result.cells
    assert row["match"] == "both" and (row["a_runs"], row["b_runs"], row["b_failed_runs"]) == (2, 2, 1)
    assert (row["a_throughput"], row["b_throughput"]) == (101, 207)  # (100+102)/2, (206+208)/2
    assert row["label"] == "torch lenet5 fashion-mnist cpu"  # nothing varies: the workload


def test_ignore_leaves_a_parameter_out_of_the_match(upgrade: Path) -> None:
    a = "sql:SELECT run_id FROM runs WHERE cell_id = 'old-t1'"
    b = "sql:SELECT run_id FROM runs WHERE cell_id = 'old-t2'"
    strict = compare(a, b, warehouse=upgrade)
    assert (len(strict.matched), len(strict.only_a), len(strict.only_b)) == (0, 1, 1)
    loose = compare(a, b, warehouse=upgrade, ignore=["threads"])
    (row,) = loose.matched
    assert row["throughput_ratio"] == pytest.approx(155 / 104) and loose.ignored == ("threads",)
    assert "threads" not in row["params"]


# -- compare: output ---------------------------------------------------------------------------


def test_csv_and_json_for_scripts(upgrade: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "old", "new", "--warehouse", str(upgrade), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["faster"] == 1 and doc["summary"]["only_b"] == 1
    assert doc["a"] == {"selector": "old", "kind": "sweep", "value": "old", "runs": 12}
    t1 = next(c for c in doc["cells"] if c["label"] == "batch_size=64 threads=1")
    assert t1["verdict"] == "faster" and t1["b_envs"] == [NEW_ENV]

    res = runner.invoke(app, ["compare", "old", "new", "--warehouse", str(upgrade), "-f", "csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(res.stdout.splitlines()))
    assert [(r["match"], r["label"], r["verdict"]) for r in rows] == [
        ("both", "batch_size=64 threads=1", "faster"),
        ("both", "batch_size=64 threads=2", "not significant"),
        ("both", "batch_size=64 threads=4", "slower"),
        ("only A", "batch_size=64 threads=8", ""),
        ("only B", "batch_size=128 threads=1", ""),
    ]
    assert float(rows[0]["throughput_ratio"]) == pytest.approx(204 / 104)
    assert res.stderr.startswith("3 matched cells")  # the summary stays off the CSV


def test_table_output_ends_with_the_summary(upgrade: Path) -> None:
    res = CliRunner().invoke(app, ["compare", "old", "new", "--warehouse", str(upgrade)])
    assert res.exit_code == 0, res.output
    assert "A: sweep old (12 runs)" in res.stdout and "only in B" in res.stdout
    assert f"environment: A {OLD_ENV} → B {NEW_ENV}" in res.stdout
    assert res.stdout.rstrip().splitlines()[-1].startswith("3 matched cells, B against A: 1 faster")


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_escapes_a_hostile_model_name_and_query(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"
    results = tmp_path / "results"
    _cell(results, "h1", "h-old", [(100, 10, .8)], {"model": evil}, OLD_ENV)
    _cell(results, "h2", "h-new", [(120, 9, .8)], {"model": evil}, NEW_ENV)
    warehouse = _warehouse(results)
    page = tmp_path / "out" / "compare.html"
    query = f"sql:SELECT run_id FROM run_overview WHERE sweep = 'h1' AND model = '{evil}'"
    res = CliRunner().invoke(app, ["compare", query, "h2", "--warehouse", str(warehouse), "--html", str(page)])
    assert res.exit_code == 0, res.output
    text = page.read_text(encoding="utf-8")
    parser = _Tags()
    parser.feed(text)
    assert "script" not in parser.tags
    assert "<script" not in text.lower()
    shown = "".join(parser.text)
    assert f"torch {evil} fashion-mnist cpu" in shown  # the label, as text
    assert f"model = '{evil}'" in shown  # the query, as text
    assert "&lt;script&gt;" in text


# -- compare: bad input ------------------------------------------------------------------------


def _runs(warehouse: Path) -> int:
    return run_query("SELECT count(*) FROM runs", warehouse=warehouse)[1][0][0]


@pytest.mark.parametrize(("a", "message"), [
    ("nope", "A: no sweep named 'nope' in warehouse {w} (sweeps: new, old)"),
    ("sweep:", "A: 'sweep:' is not a sweep name; write a sweep as NAME or sweep:NAME, or a query as "
               "sql:SELECT run_id FROM run_overview WHERE …"),
    ("SELECT run_id FROM runs", "A: 'SELECT run_id FROM runs' is not a sweep name; write a sweep as "
                                "NAME or sweep:NAME, or a query as sql:SELECT run_id FROM run_overview WHERE …"),
    ("sql:SELECT run_id FROM runs WHERE false", "A: the query selects no runs"),
    ("sql:DROP TABLE runs", "A: the query must be a SELECT that returns run ids; it is a DROP statement"),
    ("sql:COPY runs TO '{w}.csv'", "A: the query must be a SELECT that returns run ids; it is a COPY statement"),
    ("sql:SELECT run_id FROM runs; DROP TABLE runs", "A: the query must be one SELECT statement; it has 2"),
    ("sql:SELECT cell_id, sweep FROM runs", "A: the query must return a run_id column; it returned cell_id, sweep"),
    ("sql:SELECT 'x/0-1' AS run_id", "A: 1 of the selected run ids is not in the warehouse (e.g. 'x/0-1')"),
    ("sql:", "A: sql: is followed by no query; write sql:SELECT run_id FROM run_overview WHERE …"),
])
def test_bad_selections_are_refused_and_nothing_is_written(upgrade: Path, tmp_path: Path, a: str,
                                                           message: str) -> None:
    before = _runs(upgrade)
    page = tmp_path / "page.html"
    res = CliRunner().invoke(app, ["compare", a.format(w=upgrade), "new", "--warehouse", str(upgrade),
                                   "--html", str(page)])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"Error: {message.format(w=upgrade)}\n"
    assert res.stdout == "" and not page.exists()
    assert not Path(f"{upgrade}.csv").exists()
    assert _runs(upgrade) == before


@pytest.mark.parametrize(("a", "start"), [
    ("sql:SELECT * FROM read_csv('/etc/passwd')", "A: query failed: "),
    ("sql:SELECT nope FROM runs", "A: query failed: Binder Error"),
    ("sql:SELEC run_id FROM runs", "A: query failed: Parser Error"),
])
def test_sql_that_fails_is_a_clear_query_error(upgrade: Path, a: str, start: str) -> None:
    with pytest.raises(QueryError) as info:
        compare(a, "new", warehouse=upgrade)
    assert str(info.value).startswith(start)
    assert "root:" not in str(info.value)  # /etc/passwd was never read


def test_other_bad_input(upgrade: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^A and B share 12 runs \(e\.g\. old-t1/0-1\): a run cannot "
                                         r"be compared with itself; make the selections disjoint$"):
        compare("old", "sql:SELECT run_id FROM runs WHERE sweep = 'old'", warehouse=upgrade)
    with pytest.raises(InputError, match=r"^--ignore 'nope': not a cell parameter"):
        compare("old", "new", warehouse=upgrade, ignore=["nope"])
    missing = tmp_path / "none.duckdb"
    res = CliRunner().invoke(app, ["compare", "old", "new", "--warehouse", str(missing)])
    assert res.exit_code == 2
    assert res.stderr == (f"Error: warehouse {missing} does not exist; run `matrun sweep` or "
                          "`matrun ingest` first to create it\n")
    assert not missing.exists()
    res = CliRunner().invoke(app, ["compare", "old", "new", "--warehouse", str(upgrade), "-f", "xml"])
    assert (res.exit_code, res.stderr) == (2, "Error: --format 'xml': expected table, csv or json\n")


# -- advise ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("advise") / "results"
    d = {"threads": "unset", "epochs": 1}
    _cell(results, "study", "fm-default", [(t, 10, .80) for t in (100, 102, 104, 106, 108)], d)
    _cell(results, "study", "fm-threads2", [(t, 5, .80) for t in (200, 202, 204, 206, 208)], {**d, "threads": 2})
    mnist = {**d, "dataset": "mnist"}
    _cell(results, "study", "mn-default", [(100, 10, .90), (102, 10, .90)], mnist)
    _cell(results, "study", "mn-threads2", [(140, 7, .90), (144, 7, .90)], {**mnist, "threads": 2})
    mx = {**d, "framework": "mxnet"}
    _cell(results, "study", "mx-default", [(300, 4, .80), (300, 4, .80)], mx)
    _cell(results, "study", "mx-threads1", [(200, 6, .80), (200, 6, .80)], {**mx, "threads": 1})
    cifar = {**d, "dataset": "cifar10"}  # default settings twice, differing in epochs: ambiguous
    _cell(results, "study", "c10-epochs1", [(60, 10, .50)], cifar)
    _cell(results, "study", "c10-epochs2", [(60, 20, .60)], {**cifar, "epochs": 2})
    tf = {"framework": "tensorflow", "epochs": 1}
    _cell(results, "tfsweep", "tf-t1", [(50, 20, .80), (50, 20, .80)], {**tf, "threads": 1, "layout": "nchw"})
    _cell(results, "tfsweep", "tf-t2", [(80, 12, .80), (80, 12, .80)], {**tf, "threads": 2, "layout": "nhwc"})
    return _warehouse(results)


def _advice(study: Path, **kwargs: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["framework"], r["dataset"]): r for r in advise(warehouse=study, **kwargs)}


def test_advise_a_significant_gain(study: Path) -> None:
    row = _advice(study)[("torch", "fashion-mnist")]
    assert (row["default_cell_id"], row["best_cell_id"], row["changes"]) == ("fm-default", "fm-threads2", ["threads=2"])
    assert row["speedup"] == pytest.approx(204 / 104) and row["p_value"] == pytest.approx(2 / 252)
    assert (row["default_throughput_ci_low"], row["default_throughput_ci_high"]) == (100, 108)
    assert row["advice"] == (
        "PyTorch, lenet5 on fashion-mnist (cpu): threads=2 makes PyTorch 1.96× (1.89–2.04) faster than its "
        "default settings: 204 img/s median over 5 runs (range 200–208, only 94% coverage) against 104 img/s over "
        "5 runs (range 100–108, only 94% coverage); mann-whitney exact p = 0.00794. "
        "Accuracy +0.00 points (not significant).")


def test_advise_a_gain_that_is_not_significant(study: Path) -> None:
    row = _advice(study)[("torch", "mnist")]
    assert row["speedup"] == pytest.approx(142 / 101) and row["test"] == "interval overlap"
    # 2 against 2: the whole range of the pairwise ratios, 140/102 to 144/100, at 1 - 2/6
    assert (row["speedup_low"], row["speedup_high"], row["speedup_level"]) == (
        pytest.approx(140 / 102), pytest.approx(144 / 100), pytest.approx(2 / 3))
    assert row["min_repeats"] == 4
    assert row["advice"].startswith(
        "PyTorch, lenet5 on mnist (cpu): threads=2 looks 1.41× (1.37–1.44 at 67 %) faster than PyTorch's "
        "default settings, "
        "but with 2 repeats per side that is not significant (p = 0.333; so few runs cannot give "
        "p < 0.05 whatever they measure): run at least 4 repeats per side.")


def test_advise_decides_a_default_as_fast_as_the_best_by_its_interval(tmp_path: Path) -> None:
    """Not significant, but the speedup's interval inside ±5 %: 'within 5 %' (an equivalence);
    the same medians with wide spreads stay 'not significant' (undecided)."""
    results = tmp_path / "results"
    d = {"threads": "unset", "epochs": 1}
    _cell(results, "eq", "tight-default", [(t, 10, .80) for t in (100, 101, 102, 103, 104)], d)
    _cell(results, "eq", "tight-t2", [(t, 10, .80) for t in (101, 102, 103, 104, 105)], {**d, "threads": 2})
    wide = {**d, "dataset": "mnist"}
    _cell(results, "eq", "wide-default", [(t, 10, .80) for t in (80, 95, 102, 110, 125)], wide)
    _cell(results, "eq", "wide-t2", [(t, 10, .80) for t in (81, 96, 103, 111, 126)], {**wide, "threads": 2})
    rows = _advice(_warehouse(results))
    tight, loose = rows[("torch", "fashion-mnist")], rows[("torch", "mnist")]
    assert tight["verdict"] == "within 5 %" and not tight["significant"]
    assert 1 / 1.05 <= tight["speedup_low"] <= 1 <= tight["speedup_high"] <= 1.05
    assert tight["advice"].startswith(
        "PyTorch, lenet5 on fashion-mnist (cpu): PyTorch's default settings are as fast as the best cell found, "
        "to 5 %: threads=2 gives 1.01× (")
    assert loose["verdict"] == "not significant" and loose["speedup_high"] > 1.05


def test_advise_when_the_default_is_fastest(study: Path) -> None:
    row = _advice(study)[("mxnet", "fashion-mnist")]
    assert (row["verdict"], row["speedup"]) == ("default is fastest", 1.0)
    assert row["advice"] == (
        "MXNet, lenet5 on fashion-mnist (cpu): the default settings (cell mx-default) are the fastest "
        "found; none of the 1 other cell that keep its accuracy has a higher median throughput. "
        "Default: median 300 img/s over 2 runs (range 300–300, only 50% coverage).")


def test_advise_without_a_default_says_what_to_run(study: Path) -> None:
    row = _advice(study)[("tensorflow", "fashion-mnist")]
    assert row["default_cell_id"] is None and row["best_cell_id"] is None
    assert (row["closest_cell_id"], row["missing_default"]) == ("tf-t2", ['threads = "unset"'])
    assert row["advice"] == (
        "TensorFlow, lenet5 on fashion-mnist (cpu): no run with TensorFlow's default settings, so no "
        "gain over them can be measured: run a cell with threads = \"unset\" (the other parameters as "
        "in cell tf-t2) to compare against. The fastest cell found is tf-t2 (layout=\"nhwc\", "
        "threads=2): 80 img/s median over 2 runs.")


def test_advise_with_an_ambiguous_default(study: Path) -> None:
    row = _advice(study)[("torch", "cifar10")]
    assert row["default_note"] == "ambiguous: 2 cells with default settings differ in other parameters"
    assert row["advice"] == (
        "PyTorch, lenet5 on cifar10 (cpu): 2 cells have PyTorch's default settings but differ in other "
        "parameters (such as epochs or seed), so there is no single default to measure a gain against; "
        "keep one of them per workload to compare against. The fastest cell found is c10-epochs1 "
        "(epochs=1): 60 img/s median over 1 run.")


def test_advise_sweep_filter_and_formats(study: Path) -> None:
    assert list(_advice(study, sweep="tfsweep")) == [("tensorflow", "fashion-mnist")]
    runner = CliRunner()
    res = runner.invoke(app, ["advise", "--warehouse", str(study), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [(r["framework"], r["dataset"]) for r in json.loads(res.stdout)] == [
        ("mxnet", "fashion-mnist"), ("tensorflow", "fashion-mnist"), ("torch", "cifar10"),
        ("torch", "fashion-mnist"), ("torch", "mnist")]
    res = runner.invoke(app, ["advise", "--warehouse", str(study), "-f", "csv", "--sweep", "tfsweep"])
    assert res.exit_code == 0, res.output
    (row,) = list(csv.DictReader(res.stdout.splitlines()))
    assert (row["framework"], row["missing_default"], row["fastest_changes"]) == \
        ("tensorflow", 'threads = "unset"', 'layout="nhwc"; threads=2')
    res = runner.invoke(app, ["advise", "--warehouse", str(study)])
    assert res.exit_code == 0, res.output
    assert "threads=2 makes PyTorch 1.96× (1.89–2.04) faster" in res.stdout and "no default" in res.stdout


def test_advise_bad_input(study: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["advise", "--warehouse", str(study), "--sweep", "nope"])
    assert (res.exit_code, res.stderr) == (
        2, f"Error: --sweep: no sweep named 'nope' in warehouse {study} (sweeps: study, tfsweep)\n")
    res = runner.invoke(app, ["advise", "--warehouse", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 2 and res.stderr.startswith(f"Error: warehouse {tmp_path / 'x.duckdb'} does not exist")
    res = runner.invoke(app, ["advise", "--warehouse", str(study), "-f", "table"])
    assert (res.exit_code, res.stderr) == (2, "Error: --format 'table': expected text, csv or json\n")


def test_a_warehouse_last_written_before_the_views_existed_is_brought_up_to_date(study: Path,
                                                                                  tmp_path: Path) -> None:
    old = tmp_path / "old.duckdb"
    shutil.copytree(study, old)
    (old / "attach.sql").write_text(attach_sql(layout(old)))  # as its next writer would
    con = plain_writer(old)  # as a warehouse last written before the view existed
    con.execute("DROP VIEW best_vs_default")
    con.close()
    res = CliRunner().invoke(app, ["advise", "--warehouse", str(old), "--format", "json"])
    want = CliRunner().invoke(app, ["advise", "--warehouse", str(study), "--format", "json"])
    assert (res.exit_code, want.exit_code) == (0, 0)
    # the same rows; a float may differ in its last bit (a standard deviation summed in another
    # order when the caches are computed whole rather than per ingest)
    got, expected = json.loads(res.stdout), json.loads(want.stdout)
    assert [sorted(row) for row in got] == [sorted(row) for row in expected]
    for row, other in zip(got, expected):
        assert row == {k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in other.items()}


def test_advise_a_language_model_in_tokens_at_its_default_sequence_length(tmp_path: Path) -> None:
    """A transformer's default cell has no layout and compile / attention "default"; its
    candidates share its sequence length (sequences/s compare as tokens/s then), the advice
    says both rates and next-token accuracy; the fastest cell is the one with most tokens/s."""
    results = tmp_path / "results"
    lm = {"model": "gpt-tiny", "dataset": "synthetic-text", "threads": "unset", "layout": None, "epochs": 1}
    cells = [("lm-default", {}, (10.0, 10.1, 10.2, 10.3, 10.4), 64),
             ("lm-compiled", {"compile": "compiled"}, (15.0, 15.1, 15.2, 15.3, 15.4), 64),
             ("lm-long", {"compile": "compiled", "seq_len": 128}, (9.0, 9.1, 9.2, 9.3, 9.4), 128)]
    for cell_id, extra, rates, seq_len in cells:
        for repeat, rate in enumerate(rates):
            make_bundle(results, sweep="lm", cell_id=cell_id, repeat=repeat, params={**lm, **extra},
                        throughput=rate, epochs=(_epoch(10, .40),),
                        summary_extra={"seq_len": seq_len, "tokens_per_second": rate * seq_len})
    row = _advice(_warehouse(results))[("torch", "synthetic-text")]
    assert (row["default_cell_id"], row["best_cell_id"], row["changes"]) == ("lm-default", "lm-compiled",
                                                                            ['compile="compiled"'])
    assert (row["candidates"], row["seq_len"], row["verdict"]) == (2, 64, "faster")  # lm-long is no candidate
    assert row["speedup"] == pytest.approx(15.2 / 10.2)
    assert ("973 tok/s (15.2 seq/s) median over 5 runs (range 960–986, only 94% coverage) against "
            "653 tok/s (10.2 seq/s) over 5 runs (range 640–666, only 94% coverage)") in row["advice"]
    assert "Next-token accuracy +0.00 points" in row["advice"]
    assert (row["fastest_cell_id"], row["fastest_seq_len"]) == ("lm-long", 128)
