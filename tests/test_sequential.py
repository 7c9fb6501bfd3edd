"""The group-sequential design of adaptive repeats (runner/planning/sequential.py): its p-values
are the warehouse's, its level keeps the false-positive rate at 5 % where stopping at the first
p < 0.05 would not, and its simulations behave.  The error rates on real runs are measured in
benchmarks/sequential_error.py (docs/SEQUENTIAL.md)."""

from __future__ import annotations

import itertools
import math
import random

import duckdb
import pytest

from matrun.runner.planning.sequential import (
    ALPHA, MAX_ADAPTIVE, _paths, _u_counts, can_decide, design, p_value, repeats_needed, simulate,
)
from matrun.warehouse.db import macro_sql

NEEDED = ("binom_half_cdf", "median_ci_rank", "median_ci", "midranks", "mw_u", "mw_p_exact",
          "normal_two_sided_p", "mw_p_normal", "mw_can_decide", "ratio_ci_rank_exact", "ratio_ci_rank",
          "ratio_ci", "compare_samples")


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    for name, _, sql in macro_sql():
        if name in NEEDED:
            c.execute(sql)
    return c


def brute_p(u: float, m: int, n: int) -> float:
    """Two-sided p of U by enumerating every split of the ranks 1..m+n (no ties)."""
    mn = m * n
    total = hits = 0
    for xs in itertools.combinations(range(1, m + n + 1), m):
        rank_sum = sum(xs)
        uu = rank_sum - m * (m + 1) / 2
        total += 1
        hits += abs(uu - mn / 2) >= abs(u - mn / 2) - 1e-9
    return hits / total


@pytest.mark.parametrize("m,n", [(1, 1), (2, 3), (3, 3), (4, 4), (3, 7), (5, 5), (6, 6)])
def test_the_exact_p_values_are_the_enumerated_ones(m: int, n: int) -> None:
    assert sum(_u_counts(m, n)) == math.comb(m + n, m)
    for u in range(0, m * n + 1):
        assert p_value(u, m, n) == pytest.approx(brute_p(u, m, n), abs=1e-12), (m, n, u)


@pytest.mark.parametrize("m,n", [(4, 4), (5, 5), (7, 7), (8, 8), (9, 9), (12, 12), (20, 20)])
def test_the_p_values_are_the_warehouses(con: duckdb.DuckDBPyConnection, m: int, n: int) -> None:
    """The same p as compare_samples for random values without ties, exact (m + n <= 16) and
    normal beyond (the SQL's erfc approximation agrees to 1.2e-7)."""
    rng = random.Random(m * 100 + n)
    for _ in range(4):
        x = [rng.random() for _ in range(m)]
        ref = [rng.random() + rng.choice([0.0, 0.3]) for _ in range(n)]
        row = con.execute("SELECT compare_samples($x::DOUBLE[], $r::DOUBLE[])", {"x": x, "r": ref}).fetchone()[0]
        u = sum(1.0 for a in x for b in ref if a > b)
        assert row["u"] == u
        assert p_value(u, m, n) == pytest.approx(row["p_value"], abs=1e-6)


def test_the_levels_keep_the_error_rate_and_naive_stopping_does_not() -> None:
    for lo, hi in [(4, 8), (4, 12), (5, 12)]:
        d = design(lo, hi)
        achievable = {p_value(u, k, k) for k in range(lo, hi + 1) for u in range(k * k + 1)}
        assert d.level in achievable and 0 < d.level < ALPHA and d.fpr <= ALPHA
        # an independent null simulation (another seed) of the same looks
        draws = 8000
        paths = _paths(lo, hi, draws, seed=99)
        fpr = sum(1 for ps in paths if min(abs(p) for p in ps) <= d.level + 1e-12) / draws
        assert fpr <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / draws), (lo, hi, fpr)
        naive = sum(1 for ps in paths if min(abs(p) for p in ps) < ALPHA) / draws
        assert naive > 0.08, (lo, hi, naive)  # stopping at the first p < 0.05: about 10 to 13 %
    assert design(4, 12).level < design(4, 8).level  # more looks, a stricter level
    assert not can_decide(4, 4, design(4, 12).level) and can_decide(5, 5, design(4, 12).level)


def test_a_fixed_design_keeps_alpha() -> None:
    for k in (2, 4, 8, 100):
        d = design(k, k)
        assert (d.level, d.fpr, d.adaptive) == (ALPHA, ALPHA, False)


@pytest.mark.parametrize("lo,hi", [(5, 4), (0, 4), (4, MAX_ADAPTIVE + 1), (-1, 3)])
def test_a_bad_design_is_refused(lo: int, hi: int) -> None:
    with pytest.raises(ValueError):
        design(lo, hi)


def test_the_simulation_is_deterministic_and_behaves() -> None:
    d = design(4, 12)
    assert simulate(d, 1.3, 0.1, draws=500) == simulate(d, 1.3, 0.1, draws=500)
    aa = simulate(d, 1.0, 0.1, draws=3000)
    assert aa.power + aa.wrong <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 3000)
    assert aa.mean_repeats > 11  # under no difference the design mostly runs to max
    big = simulate(d, 2.0, 0.05, draws=500)
    assert big.power == 1.0 and big.mean_repeats == 5.0  # decided at the first look that can decide
    assert simulate(d, 1.1, 0.05, draws=800).power > simulate(design(4, 4), 1.1, 0.05, draws=800).power
    assert repeats_needed(1.1, 0.02, draws=300) <= 5 and repeats_needed(1.05, 0.5, draws=200) is None
