"""Bimodal repeats: the rule (warehouse/modes.py and macro two_modes, which must agree) on
real-looking numbers, and view cell_modes over bundles with controlled throughputs.

The numbers: a LeNet-5 step of batch 64 on this VM takes 5.0–5.5 ms in a fast process and
8.0–8.7 ms in a slow one (../shared/DESIGN.md), i.e. 11,636–12,800 or 7,356–8,000 images/s.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from bundle_factory import make_bundle
from matrun.warehouse.bundles.layout import CANARY_REPEAT
from matrun.warehouse.compare import compare, fmt_noisy, to_csv
from matrun.warehouse.db import macro_sql
from matrun.warehouse.ingest import ingest
from matrun.warehouse.modes import two_modes
from matrun.warehouse.query import run_query

# batch 64 over per-process median step seconds
FIVE_AND_EIGHT_MS = [64 / s for s in (0.0051, 0.0080, 0.0053, 0.0086, 0.0050, 0.0055, 0.0083)]
BIMODAL = {
    "5 ms and 8 ms steps": FIVE_AND_EIGHT_MS,
    "the modes' extremes, two of each": [64 / s for s in (0.0050, 0.0055, 0.0080, 0.0087)],
    "two slow among ten fast": [12_310, 12_080, 12_450, 12_200, 7_890, 12_390, 12_150, 7_710, 12_270, 12_330],
}
NOT_BIMODAL = {
    # throughputs of one cell with 5 % and 10 % noise: spread, but one mode
    "5 % noise": [10_120, 9_640, 10_480, 9_910, 10_050, 9_700, 10_390, 10_230],
    "10 % noise": [9_800, 10_400, 10_100, 9_500, 10_900, 9_900],
    "one slow outlier": [12_310, 12_080, 12_450, 7_890, 12_200],  # one run is no mode
    "a gap under 10 % of the median": [1000, 1001, 1002, 1060, 1061, 1062],
    "a gap within three times the wider side's range": [9_000, 9_900, 11_400, 12_600],
    "all equal": [5.0, 5.0, 5.0, 5.0],
}


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the bimodality macros of views/_macros.sql."""
    c = duckdb.connect()
    for name, _, sql in macro_sql():
        if name in ("modes_split", "two_modes"):
            c.execute(sql)
    return c


def sql_modes(con: duckdb.DuckDBPyConnection, values: list[float | None]) -> dict[str, Any] | None:
    return con.execute("SELECT two_modes($v::DOUBLE[])", {"v": values}).fetchone()[0]


@pytest.mark.parametrize("values", BIMODAL.values(), ids=list(BIMODAL))
def test_two_modes_are_found(values: list[float]) -> None:
    modes = two_modes(values)
    assert modes is not None and modes.bimodal
    assert modes.high[0] - modes.low[-1] == modes.gap > 3 * modes.spread


def test_the_5_and_8_ms_modes_split_where_the_processes_do() -> None:
    modes = two_modes(FIVE_AND_EIGHT_MS)
    assert modes is not None
    assert len(modes.low) == 3 and len(modes.high) == 4  # the 8 ms processes are the slow mode
    assert modes.low_median == pytest.approx(64 / 0.0083)
    assert modes.high_median == pytest.approx((64 / 0.0053 + 64 / 0.0051) / 2)
    assert all(v < modes.threshold for v in modes.low) and all(v > modes.threshold for v in modes.high)


@pytest.mark.parametrize("values", NOT_BIMODAL.values(), ids=list(NOT_BIMODAL))
def test_one_mode_is_not_flagged(values: list[float]) -> None:
    modes = two_modes(values)
    assert modes is not None and not modes.bimodal


def test_fewer_than_four_values_get_no_verdict() -> None:
    assert two_modes([12_800.0, 7_400.0, None, 12_700.0]) is None
    assert two_modes([]) is None


def test_unimodal_noise_is_rarely_called_bimodal() -> None:
    """Normal noise of 5 % over 6 runs: the rule's false alarms stay under 1 %."""
    rng = random.Random(7)
    alarms = sum(bool(two_modes([rng.gauss(10_000, 500) for _ in range(6)]).bimodal) for _ in range(2000))
    assert alarms < 20


def test_the_sql_macro_gives_the_python_rule(con: duckdb.DuckDBPyConnection) -> None:
    rng = random.Random(3)
    cases = [*BIMODAL.values(), *NOT_BIMODAL.values()]
    for _ in range(300):  # mixtures of two normal modes, some far apart, some not
        n = rng.randint(4, 12)
        split = rng.uniform(1.0, 1.8)
        cases.append([rng.gauss(1000 * (split if rng.random() < 0.4 else 1), rng.uniform(5, 60)) for _ in range(n)])
    flagged = 0
    for values in cases:
        py, sql = two_modes(values), sql_modes(con, values)
        assert py is not None and sql is not None
        assert sql["bimodal"] == py.bimodal, values
        assert (sql["low_n"], sql["high_n"]) == (len(py.low), len(py.high))
        assert sql["low_median"] == pytest.approx(py.low_median)
        assert sql["high_median"] == pytest.approx(py.high_median)
        assert (sql["gap"], sql["spread"]) == (pytest.approx(py.gap), pytest.approx(py.spread))
        flagged += py.bimodal
    assert 30 < flagged < len(cases) - 30  # both verdicts were exercised
    assert sql_modes(con, [1.0, None, 2.0]) is None


# -- view cell_modes, through ingest ------------------------------------------------------

SLOW, FAST, NOISY, FEW = "5105000000000001", "5105000000000002", "5105000000000003", "5105000000000004"
CELL_MODES = ("cell_id, framework, variant, model, dataset, device, runs, throughput_median, bimodal, "
              "slow_runs, slow_throughput_median, fast_runs, fast_throughput_median, fast_over_slow, gap, spread")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cell SLOW: the 5 / 8 ms processes (3 slow, 4 fast) plus a failed run and a canary run
    (neither counts).  Cell FAST: four fast runs and two canary runs in the slow mode (not
    counted: one mode).  Cell NOISY: 10 % noise.  Cell FEW: three runs."""
    root = tmp_path_factory.mktemp("modes")
    results = root / "results"
    for repeat, value in enumerate(FIVE_AND_EIGHT_MS):
        make_bundle(results, cell_id=SLOW, repeat=repeat, throughput=value)
    make_bundle(results, cell_id=SLOW, repeat=7, status="failed", exit_code=1)
    make_bundle(results, cell_id=SLOW, repeat=CANARY_REPEAT, throughput=3_000.0)
    for repeat, value in enumerate([12_310, 12_080, 12_450, 12_200]):
        make_bundle(results, cell_id=FAST, repeat=repeat, throughput=float(value))
    for attempt in (1, 2):
        make_bundle(results, cell_id=FAST, repeat=CANARY_REPEAT, attempt=attempt, throughput=7_800.0 + attempt)
    for repeat, value in enumerate(NOT_BIMODAL["10 % noise"]):
        make_bundle(results, cell_id=NOISY, repeat=repeat, throughput=float(value))
    for repeat, value in enumerate([12_800, 7_400, 12_700]):
        make_bundle(results, cell_id=FEW, repeat=repeat, throughput=float(value))
    report = ingest([results], warehouse=root / "w")
    assert len(report.ingested) == 24 and not report.skipped
    return root / "w"


def rows(warehouse: Path, sql: str) -> dict[str, dict[str, Any]]:
    columns, found = run_query(sql, warehouse=warehouse)
    return {row[0]: dict(zip(columns, row)) for row in found}


def test_cell_modes_has_its_columns(warehouse: Path) -> None:
    columns, _ = run_query("SELECT * FROM cell_modes", warehouse=warehouse)
    assert columns == CELL_MODES.split(", ")


def test_cell_modes_flags_the_bimodal_cell_and_gives_both_modes(warehouse: Path) -> None:
    cells = rows(warehouse, "SELECT * FROM cell_modes")
    slow = cells[SLOW]
    assert (slow["runs"], slow["bimodal"], slow["slow_runs"], slow["fast_runs"]) == (7, True, 3, 4)
    assert slow["slow_throughput_median"] == pytest.approx(64 / 0.0083)
    fast = (64 / 0.0053 + 64 / 0.0051) / 2
    assert slow["fast_throughput_median"] == pytest.approx(fast)
    assert slow["fast_over_slow"] == pytest.approx(fast / (64 / 0.0083))
    assert slow["gap"] == pytest.approx(64 / 0.0055 - 64 / 0.0080)
    # the cell's one median is the slowest fast run: a number of neither mode's middle
    assert slow["throughput_median"] == pytest.approx(64 / 0.0055)


def test_cell_modes_leaves_one_mode_canary_runs_and_few_runs_alone(warehouse: Path) -> None:
    cells = rows(warehouse, "SELECT * FROM cell_modes")
    assert (cells[FAST]["runs"], cells[FAST]["bimodal"]) == (4, False)  # the slow canary runs do not count
    assert cells[FAST]["slow_runs"] is None and cells[FAST]["fast_throughput_median"] is None
    assert (cells[NOISY]["runs"], cells[NOISY]["bimodal"]) == (6, False)
    assert (cells[FEW]["runs"], cells[FEW]["bimodal"], cells[FEW]["gap"]) == (3, None, None)


def test_the_cell_statistics_leave_the_canary_runs_out(warehouse: Path) -> None:
    stats = rows(warehouse, "SELECT cell_id, runs, failed_runs, throughput_n FROM cell_stats")
    assert (stats[SLOW]["runs"], stats[SLOW]["failed_runs"], stats[SLOW]["throughput_n"]) == (7, 1, 7)
    assert stats[FAST]["runs"] == 4
    overview = rows(warehouse, "SELECT cell_id, count(*) AS n FROM run_overview GROUP BY cell_id")
    assert (overview[SLOW]["n"], overview[FAST]["n"]) == (8, 4)


def test_matrun_compare_says_which_side_is_bimodal(warehouse: Path) -> None:
    result = compare(f"sql:SELECT run_id FROM runs WHERE cell_id = '{SLOW}'",
                     f"sql:SELECT run_id FROM runs WHERE cell_id = '{NOISY}'", warehouse=warehouse)
    [cell] = result.cells
    assert (cell["a_runs"], cell["b_runs"]) == (7, 6)  # the canary run selected on A is no run of the cell
    assert (cell["a_bimodal"], cell["b_bimodal"], cell["a_noisy"], cell["b_noisy"]) == (True, False, True, False)
    assert fmt_noisy(cell) == "A bimodal"
    assert "a_bimodal" in to_csv(result).splitlines()[0].split(",")


def test_the_report_flags_the_bimodal_cell(warehouse: Path, tmp_path: Path) -> None:
    from matrun.reports.build import build_report  # Polars and Plotly load slowly

    index = build_report(warehouse=warehouse, out_dir=tmp_path / "report")
    html = (index.parent / "baseline.html").read_text(encoding="utf-8")
    flags = re.findall(r'<span class="flag warn" title="([^"]*)">bimodal</span>', html)
    assert len(flags) == 1  # cell SLOW only
    assert flags[0].startswith(f"the runs fall into two modes: 3 at {64 / 0.0083:,.1f} and 4 at ")
