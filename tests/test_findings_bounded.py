"""The `bounded` check of the ``findings`` view (docs/WAREHOUSE.md, "Studies and findings"):
equivalence is decided with an interval, not with a large p.  'reproduced' only when, for
every other value of x, the Hodges-Lehmann interval of the change (the ratio, or for accuracy
the difference in percentage points: macro shift_ci) is a 95 % interval inside the bound;
'contradicted' when a median beyond the bound differs significantly; 'not significant'
(undecided, with the reason in `observed`) otherwise.  Every number is worked out by hand from
the runs below (4 runs against 4: k = 1, the interval is the smallest and the largest
pairwise difference or ratio, at 1 - 2/70).

Configurations, told apart by the dataset (x = threads, reference 1 thread):

    accuracy (model lenet5, within 1 pp)   throughput (model alexnet, within 5 %)
    mnist    close medians, wide interval  close medians, wide interval
    fashion  tight runs, 3 values of x     tight runs
    cifar10  1 run against 1               a throughput of 0 (no logarithm)
    synth.   2 against 2 (a 67 % interval) significant +3.9 %, interval beyond 5 %
    imagenet a NaN accuracy (diverged run)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from matrun.warehouse.db import macro_sql, open_warehouse
from matrun.warehouse.findings import register_study
from matrun.warehouse.ingest import ingest
from test_findings import _cell, _study, by_dataset, query

FINDINGS = [
    {"id": "acc", "claim": "c", "cite": "T", "check": "bounded", "x": "threads", "ref": 1,
     "metric": "accuracy", "at_most": 1.0, "where": {"model": "lenet5"}},
    {"id": "tp", "claim": "c", "cite": "T", "check": "bounded", "x": "threads", "ref": 1,
     "metric": "throughput", "at_most": 0.05, "where": {"model": "alexnet"}},
    {"id": "time", "claim": "c", "cite": "T", "check": "bounded", "x": "threads", "ref": 1,
     "metric": "train_s", "at_most": 0.05, "where": {"model": "vgg11"}},
]
LEVEL_4_4 = 1 - 2 / 70


def _cells(results: Path) -> list[str]:
    cells = []

    def add(name: str, params: dict[str, Any], **values: Any) -> None:
        cells.append(_cell(results, name, params, **values))

    acc = {"mnist": {1: [.80, .81, .80, .81], 2: [.79, .795, .80, .80]},
           "fashion-mnist": {1: [.800, .801, .802, .803, .804], 2: [.801, .802, .803, .804],
                             4: [.799, .800, .800, .801, .802, .803]},
           "cifar10": {1: [.80], 2: [.805]},
           "synthetic": {1: [.80, .801], 2: [.80, .801]},
           "imagenet": {1: [.80, .80, .80, .80], 2: [.80, math.nan, .80, .80]}}
    for ds, by_threads in acc.items():
        for threads, values in by_threads.items():
            add(f"acc-{ds}-t{threads}", {"model": "lenet5", "dataset": ds, "threads": threads}, accuracy=values)
    tp = {"mnist": {1: [100, 104, 96, 100], 2: [101, 95, 105, 99]},
          "fashion-mnist": {1: [100, 101, 102, 103], 2: [101, 102, 103, 104]},
          "cifar10": {1: [100, 101, 102, 103], 2: [0.0, 101, 102, 103]},
          "synthetic": {1: [100, 101, 102, 103], 2: [104, 105, 106, 107]}}
    for ds, by_threads in tp.items():
        for threads, values in by_threads.items():
            add(f"tp-{ds}-t{threads}", {"model": "alexnet", "dataset": ds, "threads": threads}, throughput=values)
    add("time-t1", {"model": "vgg11", "threads": 1}, train_s=[10, 10.1, 10.2, 10.3])
    add("time-t2", {"model": "vgg11", "threads": 2}, train_s=[-1.0, 10.1, 10.2, 10.3])
    return cells


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("bounded") / "results"
    cells = _cells(results)
    path = results.parent / "w.duckdb"
    assert not ingest([results], warehouse=path).skipped
    with open_warehouse(path) as wh:
        register_study(wh.con, _study("A5-bounded", FINDINGS), profile="quick", matrix="studies/A5-bounded.toml",
                       cell_ids=cells)
    return path


def rows(warehouse: Path, finding: str) -> dict[str, dict[str, Any]]:
    return by_dataset(query(warehouse, f"SELECT * FROM findings WHERE study = 'A5-bounded' AND finding = '{finding}'"))


def test_close_medians_with_a_wide_interval_are_undecided(warehouse: Path) -> None:
    acc = rows(warehouse, "acc")["mnist"]
    # medians .805 and .7975: -0.75 pp, within 1 pp; but the differences run from .79 - .81 to
    # .80 - .80: the interval reaches -2 pp
    assert acc["verdict"] == "not significant"
    assert acc["effect"] == pytest.approx(-0.75)
    assert acc["observed"] == ("largest change: 2 threads: 79.75 % vs 1 thread: 80.50 % (-0.75 pp (-2.00 to +0.00)); "
                               "2 values of threads; interval -2.00 to +0.00 pp reaches beyond ±1.00 pp: "
                               "more runs needed")
    assert acc["test"] == "Hodges–Lehmann 97 % interval of the difference against the bound"
    assert (acc["ratio_low"], acc["ratio_high"], acc["ratio_level"]) == (
        pytest.approx(.79 / .81), pytest.approx(1.0), pytest.approx(LEVEL_4_4))
    assert acc["p_value"] is not None and (acc["n"], acc["ref_n"]) == (4, 4)
    tp = rows(warehouse, "tp")["mnist"]
    # both medians 100 img/s (no change at all), the ratios from 95 / 104 to 105 / 96
    assert tp["verdict"] == "not significant" and tp["effect"] == pytest.approx(0.0)
    assert tp["observed"] == ("largest change: 2 threads: 100 img/s vs 1 thread: 100 img/s (1.00× (0.91–1.09), "
                              "+0.0 %); 2 values of threads; interval 0.91–1.09 reaches beyond ±5.00 %: "
                              "more runs needed")
    assert (tp["ratio_low"], tp["ratio_high"]) == (pytest.approx(95 / 104), pytest.approx(105 / 96))
    assert tp["test"] == "Hodges–Lehmann 97 % interval of the ratio against the bound"


def test_tight_runs_within_the_bound_are_reproduced(warehouse: Path) -> None:
    tp = rows(warehouse, "tp")["fashion-mnist"]
    # ratios from 101 / 103 to 104 / 100: inside 0.95 - 1.05
    assert tp["verdict"] == "reproduced"
    assert tp["observed"] == ("largest change: 2 threads: 102 img/s vs 1 thread: 102 img/s (1.01× (0.98–1.04), "
                              "+1.0 %); 2 values of threads")
    assert (tp["ratio_low"], tp["ratio_high"], tp["ratio_level"]) == (
        pytest.approx(101 / 103), pytest.approx(104 / 100), pytest.approx(LEVEL_4_4))
    assert tp["test"] == ("Hodges–Lehmann 97 % interval of the ratio within the bound for every other value "
                          "of threads (1) against 1 thread")


def test_accuracy_is_bounded_by_the_interval_of_the_difference(warehouse: Path) -> None:
    acc = rows(warehouse, "acc")["fashion-mnist"]
    # 1 thread (5 runs, median .802) against 2 threads (4 runs, median .8025) and 4 threads (6
    # runs, median .8005): the largest change is 4 threads', -0.15 pp.  Its interval, 6 runs
    # against 5: k = 4 (ratio_ci_rank), the 4th smallest and the 4th largest of the 30 pairwise
    # differences, at 1 - 14/462; 4 against 5 has its own level (1 - 4/126), so the test names
    # the smaller: at least 97 %.
    four, one = [.799, .800, .800, .801, .802, .803], [.800, .801, .802, .803, .804]
    d = sorted(a - b for a in four for b in one)
    assert acc["verdict"] == "reproduced"
    assert (acc["cell_id"], acc["ref_cell_id"]) == ("acc-fashion-mnist-t4", "acc-fashion-mnist-t1")
    assert acc["effect"] == pytest.approx(-0.15)
    assert acc["observed"] == (f"largest change: 4 threads: 80.05 % vs 1 thread: 80.20 % "
                               f"(-0.15 pp ({d[3] * 100:+.2f} to {d[-4] * 100:+.2f})); 3 values of threads")
    assert acc["test"] == ("Hodges–Lehmann at least 97 % interval of the difference within the bound for "
                           "every other value of threads (2) against 1 thread")
    assert acc["ratio_level"] == pytest.approx(1 - 14 / 462)


def test_the_macro_shift_ci(con: duckdb.DuckDBPyConnection) -> None:
    def shift(x: list[float | None] | None, ref: list[float | None] | None) -> dict[str, Any] | None:
        return con.execute("SELECT shift_ci($x::DOUBLE[], $r::DOUBLE[])", {"x": x, "r": ref}).fetchone()[0]

    got = shift([.79, .795, .80, .80], [.80, .81, .80, .81])
    assert got == {"shift": pytest.approx(-.0075), "shift_hl": pytest.approx(-.01), "shift_low": pytest.approx(-.02),
                   "shift_high": pytest.approx(0.0), "shift_level": pytest.approx(LEVEL_4_4), "shift_note": None}
    # the rank and the level are ratio_ci's: the same pairs on the log scale give the same k
    x, ref = [10.0, 12, 11, 15, 13], [9.0, 13, 10.5, 14, 12, 11]
    ratio = con.execute("SELECT ratio_ci($x, $r)", {"x": x, "r": ref}).fetchone()[0]
    got = shift(x, ref)
    k = con.execute("SELECT ratio_ci_rank(5, 6).k").fetchone()[0]
    d = sorted(a - b for a in x for b in ref)
    assert (got["shift_low"], got["shift_high"], got["shift_level"]) == (
        pytest.approx(d[k - 1]), pytest.approx(d[-k]), pytest.approx(ratio["ratio_level"]))
    # NULL and NaN are left out, as compare_samples leaves them out
    assert shift([.79, None, .795, math.nan, .80, .80], [.80, .81, math.nan, .80, .81]) == shift(
        [.79, .795, .80, .80], [.80, .81, .80, .81])
    one = shift([.8], [.7])
    assert (one["shift"], one["shift_low"], one["shift_level"], one["shift_note"]) == (
        pytest.approx(.1), None, None, "one value on each side: no interval")
    inf = shift([.8, math.inf], [.7, .71])
    assert (inf["shift_low"], inf["shift_high"], inf["shift_note"]) == (
        None, None, "an infinite value: no interval of the difference")
    assert shift([math.nan, None], [.7]) is None and shift(None, [.7]) is None and shift([], [.7]) is None


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    for name, _, sql in macro_sql():
        if name in ("normal_two_sided_p", "ratio_ci_rank_exact", "ratio_ci_rank", "ratio_ci", "shift_ci", "fmt_pp_ci"):
            c.execute(sql)
    return c


def test_the_label_of_a_difference(con: duckdb.DuckDBPyConnection) -> None:
    def label(d: float | None, low: float | None, high: float | None, level: float | None) -> str:
        return con.execute("SELECT fmt_pp_ci($d, $lo, $hi, $lvl)", {"d": d, "lo": low, "hi": high, "lvl": level}).fetchone()[0]

    assert label(-0.25, -0.9, 0.4, LEVEL_4_4) == "-0.25 pp (-0.90 to +0.40)"
    assert label(0.5, -1, 2, 2 / 3) == "+0.50 pp (-1.00 to +2.00 at 67 %)"
    assert label(1.0, None, None, None) == "+1.00 pp"
    assert label(None, 1, 2, 1) == "n/a pp"


@pytest.mark.parametrize("finding, dataset, reason", [
    ("acc", "cifar10", "no interval (one value on each side)"),
    ("acc", "synthetic", "interval -0.10 to +0.10 pp within ±1.00 pp, but at 67 %, not 95 %"),
    ("acc", "imagenet", "interval +0.00 to +0.00 pp within ±1.00 pp, but at 94 %, not 95 %"),
    ("tp", "cifar10", "no interval (a value <= 0 or infinite)"),
    ("tp", "synthetic", "interval 1.01–1.07 reaches beyond ±5.00 %"),
    ("time", None, "no interval (a value <= 0 or infinite)"),
], ids=["1 against 1", "2 against 2", "a NaN accuracy", "a zero", "significant within the bound", "a negative"])
def test_hostile_and_thin_runs_are_undecided_with_a_reason(warehouse: Path, finding: str, dataset: str | None,
                                                           reason: str) -> None:
    found = rows(warehouse, finding)
    row = found[dataset] if dataset else next(iter(found.values()))
    assert row["verdict"] == "not significant"
    assert row["observed"].endswith(f"; {reason}: more runs needed"), row["observed"]
    assert row["test"].startswith("Hodges–Lehmann ") and row["test"].endswith(" against the bound")
    if reason.startswith("no interval"):
        assert (row["ratio_low"], row["ratio_high"], row["ratio_level"]) == (None, None, None)
        assert row["test"] == f"Hodges–Lehmann interval of the {'difference' if finding == 'acc' else 'ratio'} against the bound"


def test_a_significant_change_within_the_bound_is_not_a_contradiction(warehouse: Path) -> None:
    row = rows(warehouse, "tp")["synthetic"]
    # 105.5 / 101.5: +3.9 %, within 5 %, and significant (4 against 4, p = 2/70); the interval
    # 104 / 103 - 107 / 100 reaches 7 %: neither inside (reproduced) nor beyond (contradicted)
    assert row["p_value"] == pytest.approx(2 / 70)
    assert row["effect"] == pytest.approx(105.5 / 101.5 - 1)
    assert (row["ratio_low"], row["ratio_high"]) == (pytest.approx(104 / 103), pytest.approx(107 / 100))


def test_a_nan_accuracy_leaves_the_run_out(warehouse: Path) -> None:
    row = rows(warehouse, "acc")["imagenet"]
    assert (row["n"], row["ref_n"]) == (3, 4)  # the diverged run has no accuracy
