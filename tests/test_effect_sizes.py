"""Effect sizes with intervals (docs/WAREHOUSE.md, "Statistics"): the ratio fields of macro
compare_samples (macro ratio_ci) against an independent implementation in this file: the
null distribution of Mann-Whitney U enumerated with itertools, the Hodges-Lehmann interval
from the sorted pairwise log differences, and the normal approximation beyond 16 values.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import statistics
from typing import Any

import duckdb
import pytest

from matrun.warehouse.db import macro_sql

#: The macros the comparison needs (the rest of views/_macros.sql reads tables).
NEEDED = ("binom_half_cdf", "median_ci_rank", "median_ci", "midranks", "mw_u", "mw_p_exact",
          "normal_two_sided_p", "mw_p_normal", "mw_can_decide", "ratio_ci_rank_exact", "ratio_ci_rank",
          "ratio_ci", "compare_samples", "fmt_num", "fmt_ratio", "fmt_ratio_ci")


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the statistics macros of views/_macros.sql."""
    c = duckdb.connect()
    for name, _, sql in macro_sql():
        if name in NEEDED:
            c.execute(sql)
    return c


def compare(con: duckdb.DuckDBPyConnection, x: list[float | None] | None,
            ref: list[float | None] | None) -> dict[str, Any] | None:
    return con.execute("SELECT compare_samples($x::DOUBLE[], $r::DOUBLE[])", {"x": x, "r": ref}).fetchone()[0]


# -- the independent implementation ----------------------------------------------------------


def u_null_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) rank splits give each U = 0 .. mn (no ties): enumerated up
    to 12 values, beyond by the recurrence (checked against the enumeration below)."""
    if m + n > 12:
        return u_counts_recurrence(m, n)
    counts = [0] * (m * n + 1)
    for xs in itertools.combinations(range(m + n), m):
        refs = [r for r in range(m + n) if r not in xs]
        counts[sum(a > b for a in xs for b in refs)] += 1
    return counts


@functools.cache
def u_counts_recurrence(m: int, n: int) -> list[int]:
    """The same by c(u; m, n) = c(u - n; m - 1, n) + c(u; m, n - 1): the largest of the m + n
    ranks is x's (it beats all n refs) or ref's."""
    if m == 0 or n == 0:
        return [1]
    a, b = u_counts_recurrence(m - 1, n), u_counts_recurrence(m, n - 1)
    return [(a[u - n] if 0 <= u - n < len(a) else 0) + (b[u] if u < len(b) else 0) for u in range(m * n + 1)]


def interval_rank(m: int, n: int) -> tuple[int, float]:
    """(k, level): the largest k with P(U <= k-1) <= 0.025 (at least 1) and 1 - 2 P(U <= k-1);
    beyond 16 values the normal approximation with a continuity correction."""
    if m + n <= 16:
        counts = u_null_counts(m, n)
        total = math.comb(m + n, m)
        k = max([1] + [k for k in range(1, (m * n + 1) // 2 + 1) if sum(counts[:k]) <= 0.025 * total])
        return k, 1 - 2 * sum(counts[:k]) / total
    sigma = math.sqrt(m * n * (m + n + 1) / 12)
    k = max(1, math.floor(m * n / 2 + 0.5 - 1.959964 * sigma))
    return k, 1 - math.erfc(abs(k - 0.5 - m * n / 2) / sigma / math.sqrt(2))


def hodges_lehmann(x: list[float], ref: list[float]) -> dict[str, float]:
    d = sorted(math.log(a) - math.log(b) for a in x for b in ref)
    k, level = interval_rank(len(x), len(ref))
    return {"ratio": statistics.median(x) / statistics.median(ref), "ratio_hl": math.exp(statistics.median(d)),
            "ratio_low": math.exp(d[k - 1]), "ratio_high": math.exp(d[len(d) - k]), "ratio_level": level}


def ratio_fields(got: dict[str, Any]) -> dict[str, Any]:
    return {k: got[k] for k in ("ratio", "ratio_hl", "ratio_low", "ratio_high", "ratio_level")}


# -- the cases -------------------------------------------------------------------------------

CASES = {
    "4 vs 4 separated": ([1, 2, 3, 4], [5, 6, 7, 8]),
    "4 vs 4 overlapping": ([10, 12, 11, 15], [9, 13, 10.5, 14]),
    "5 vs 5": ([10, 11, 12, 13, 14], [7, 7.5, 8, 8.5, 9]),
    "3 vs 5": ([6, 7, 8], [1, 2, 3, 4, 5]),
    "2 vs 2": ([1, 2], [3, 4]),
    "1 vs 3": ([2], [1, 3, 4]),
    "ties within and across": ([1, 2, 2, 3], [2, 3, 4, 5, 5]),
    "8 vs 8 (exact, 16 values)": ([float(v) for v in range(20, 28)], [float(v) for v in range(15, 31, 2)]),
    "9 vs 8 (normal, 17 values)": ([float(v) for v in range(20, 29)], [float(v) for v in range(15, 31, 2)]),
    "12 vs 10": ([100 + 3 * i for i in range(12)], [90 + 4 * i for i in range(10)]),
}


@pytest.mark.parametrize(("x", "ref"), CASES.values(), ids=list(CASES))
def test_ratio_interval_is_the_hodges_lehmann_interval_of_the_log_ratio(
        con: duckdb.DuckDBPyConnection, x: list[float], ref: list[float]) -> None:
    got = compare(con, x, ref)
    want = hodges_lehmann(x, ref)
    # the level beyond 16 values goes through the erfc fit (relative error < 1.2e-7)
    assert ratio_fields(got) == {k: pytest.approx(v, rel=1e-6 if k == "ratio_level" else 1e-9)
                                 for k, v in want.items()}
    assert got["ratio_note"] is None
    assert got["ratio_low"] <= got["ratio_hl"] <= got["ratio_high"]


def test_ranks_and_levels_agree_with_the_enumerated_null_distribution(con: duckdb.DuckDBPyConnection) -> None:
    for m, n in [(m, n) for m in range(1, 11) for n in range(1, 11 - m)]:
        assert u_counts_recurrence(m, n) == u_null_counts(m, n)
    # every entry of the macro's table
    for m, n in [(m, n) for m in range(1, 16) for n in range(1, 17 - m)]:
        got = con.execute(f"SELECT ratio_ci_rank({m}, {n})").fetchone()[0]
        k, level = interval_rank(m, n)
        assert (got["k"], got["level"]) == (k, pytest.approx(level, abs=1e-12)), (m, n)
    # beyond 16 values, the normal approximation
    for m, n in [(9, 8), (10, 10), (20, 5), (30, 30)]:
        got = con.execute(f"SELECT ratio_ci_rank({m}, {n})").fetchone()[0]
        k, level = interval_rank(m, n)
        assert (got["k"], got["level"]) == (k, pytest.approx(level, rel=1e-6)), (m, n)


def test_four_against_four_uses_the_full_range_at_68_of_70(con: duckdb.DuckDBPyConnection) -> None:
    # P(U = 0) = 1/70 <= 0.025 but P(U <= 1) = 2/70 is not: k = 1, the smallest and largest
    # pairwise ratio, coverage 1 - 2/70
    got = compare(con, [1, 2, 3, 4], [5, 6, 7, 8])
    assert got["ratio_low"] == pytest.approx(1 / 8)
    assert got["ratio_high"] == pytest.approx(4 / 5)
    assert got["ratio_level"] == pytest.approx(1 - 2 / 70)
    assert got["ratio"] == pytest.approx(2.5 / 6.5)


def test_interval_excludes_1_when_significant_and_includes_it_when_not(con: duckdb.DuckDBPyConnection) -> None:
    decided = compare(con, [10, 11, 12, 13, 14], [7, 7.5, 8, 8.5, 9])
    assert decided["significant"] and decided["ratio_low"] > 1
    undecided = compare(con, [10, 12, 11, 15], [9, 13, 10.5, 14])
    assert not undecided["significant"] and undecided["ratio_low"] < 1 < undecided["ratio_high"]


def test_without_ties_the_interval_and_the_exact_test_agree(con: duckdb.DuckDBPyConnection) -> None:
    # the interval is the set of ratios the test would not reject: up to 16 values and without
    # ties, significant exactly when 1 is outside it
    rng = random.Random(27)
    for _ in range(25):
        m, n = rng.randint(4, 7), rng.randint(4, 7)
        values = rng.sample(range(50, 200), m + n)
        scale = rng.choice([1.0, 1.3, 1.8])
        x, ref = [v * scale for v in values[:m]], [float(v) for v in values[m:]]
        got = compare(con, x, ref)
        assert got["significant"] == (not got["ratio_low"] <= 1 <= got["ratio_high"]), (x, ref, got)


def test_equal_samples_give_a_ratio_of_one(con: duckdb.DuckDBPyConnection) -> None:
    got = compare(con, [0.8, 0.8], [0.8, 0.8])
    assert ratio_fields(got) == {"ratio": 1.0, "ratio_hl": 1.0, "ratio_low": 1.0, "ratio_high": 1.0,
                                 "ratio_level": pytest.approx(2 / 3)}
    got = compare(con, [5, 6, 7, 8], [5, 6, 7, 8])
    assert got["ratio_hl"] == pytest.approx(1.0) and got["ratio_low"] < 1 < got["ratio_high"]


def test_one_value_per_side_has_a_ratio_but_no_interval(con: duckdb.DuckDBPyConnection) -> None:
    got = compare(con, [3.0], [2.0])
    assert ratio_fields(got) == {"ratio": 1.5, "ratio_hl": pytest.approx(1.5), "ratio_low": None,
                                 "ratio_high": None, "ratio_level": None}
    assert got["ratio_note"] == "one value on each side: no interval"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")], ids=["zero", "negative", "infinite"])
def test_values_without_a_logarithm_give_no_interval(con: duckdb.DuckDBPyConnection, bad: float) -> None:
    got = compare(con, [1.0, 2.0, bad, 3.0], [2.0, 3.0, 4.0, 5.0])
    assert (got["ratio_hl"], got["ratio_low"], got["ratio_high"], got["ratio_level"]) == (None,) * 4
    assert got["ratio_note"] == "a value <= 0 or infinite: no interval of the ratio"
    assert got["p_value"] is not None  # the test still runs


def test_null_and_nan_values_are_left_out(con: duckdb.DuckDBPyConnection) -> None:
    clean = compare(con, [10, 11, 12, 13], [7, 8, 9, 9.5])
    assert compare(con, [10, None, 11, float("nan"), 12, 13], [7, 8, None, 9, 9.5]) == clean
    assert compare(con, [None, float("nan")], [1.0, 2.0]) is None
    assert compare(con, None, [1.0, 2.0]) is None
    assert con.execute("SELECT ratio_ci([]::DOUBLE[], [1.0])").fetchone()[0] is None


def test_a_zero_median_reference_has_no_ratio(con: duckdb.DuckDBPyConnection) -> None:
    got = compare(con, [1.0, 2.0], [0.0, 0.0, 0.0])
    assert got["ratio"] is None and got["ratio_low"] is None and got["ratio_note"] is not None


def test_the_label(con: duckdb.DuckDBPyConnection) -> None:
    def label(*args: Any) -> str:
        return con.execute("SELECT fmt_ratio_ci($r, $lo, $hi, $lvl)",
                           dict(zip(("r", "lo", "hi", "lvl"), args))).fetchone()[0]

    assert label(1.39, 1.31, 1.47, 0.96) == "1.39× (1.31–1.47)"
    assert label(1.39, 0.9, 2.1, 2 / 3) == "1.39× (0.90–2.10 at 67 %)"
    assert label(1.39, None, None, None) == "1.39×"
    assert label(None, None, None, None) == "n/a"
    assert label(12.3, 10.04, 15.0, 0.97) == "12.3× (10.0–15.0)"
