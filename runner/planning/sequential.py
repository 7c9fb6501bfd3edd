"""Adaptive repeats: the group-sequential design of ``[sweep] repeats = { min, max }``
(docs/MATRIX.md "Adaptive repeats", docs/WAREHOUSE.md "Statistics").

A verdict compares two cells' runs with a two-sided Mann-Whitney test (the warehouse's
``compare_samples``: exact up to 16 values, the normal approximation with a continuity
correction beyond).  An adaptive sweep looks at every undecided comparison after each round
of repeats, from ``min`` to ``max`` values a side, and adds a repeat only where it is still
undecided.  Stopping as soon as p < 0.05 would call a difference in about one A/A comparison
in six (the nominal level spent at every look); so every look of an adaptive design uses one
nominal level ``c`` (a Pocock-type boundary), the largest achievable p-value with

    P(p_k <= c at some look k = min .. max | no difference) <= alpha.

Under no difference the two cells' values are exchangeable, so every order of the pooled
values is equally likely, and the joint distribution of the looks' p-values depends on
nothing else: it is simulated here with uniform values, a fixed seed and ``DRAWS`` draws (the
p-values computed as the warehouse computes them), which makes ``c`` a property of (min, max)
alone, the same on every host.  A fixed design (min = max) has one look and keeps alpha.

The runs of an adaptive sweep carry ``c`` (result.json ``design``, ``runs.design_level``),
and every comparison of a cell with such runs is significant only at p <= c (the smaller of
its two cells' levels): the verdict the sweep stopped on is the one the views give.
``simulate`` runs the same procedure on log-normal values with a given ratio and coefficient
of variation: its power and the repeats it uses (``matrun plan --detect``,
benchmarks/sequential_error.py).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from functools import lru_cache

#: The error rate every verdict keeps: the two-sided level of a fixed design.
ALPHA = 0.05
#: Draws of the null simulation that fixes a design's level (its standard error at 0.05: 0.0015).
DRAWS = 20_000
#: The simulation's seed: a design's level is the same everywhere.
SEED = 20261128
#: The most repeats an adaptive design may reach (the simulation is quadratic beyond the
#: exact range only through its p-value tables; 100 keeps a design under a few seconds).
MAX_ADAPTIVE = 100
#: Up to this many values in all the p-value is exact (as the warehouse's mw_p_exact).
EXACT_TOTAL = 16


@lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of the C(m+n, m) rank splits (no ties) with U = 0 .. mn."""
    # f[i][j][u]: splits of i x-values and j ref-values with U = u; built over j for fixed m.
    table: dict[tuple[int, int], list[int]] = {}

    def f(i: int, j: int) -> list[int]:
        if (i, j) in table:
            return table[(i, j)]
        if i == 0 or j == 0:
            out = [1]
        else:
            # the largest value is an x (it beats all j refs) or a ref
            a, b = f(i - 1, j), f(i, j - 1)
            out = [0] * (i * j + 1)
            for u, c in enumerate(a):
                out[u + j] += c
            for u, c in enumerate(b):
                out[u] += c
        table[(i, j)] = out
        return out

    return tuple(f(m, n))


@lru_cache(maxsize=None)
def _p_table(m: int, n: int) -> tuple[float, ...]:
    """Two-sided p of the test of m against n values, indexed by 2U (U in halves: 0 .. 2mn)."""
    mn = m * n
    if m + n <= EXACT_TOTAL:
        counts = _u_counts(m, n)
        total = sum(counts)
        out = []
        for u2 in range(2 * mn + 1):
            dev = abs(u2 / 2 - mn / 2)
            out.append(sum(c for u, c in enumerate(counts) if abs(u - mn / 2) >= dev - 1e-9) / total)
        return tuple(out)
    sigma = math.sqrt(mn * (m + n + 1) / 12.0)
    return tuple(min(1.0, math.erfc(max(abs(u2 / 2 - mn / 2) - 0.5, 0) / sigma / math.sqrt(2)))
                 for u2 in range(2 * mn + 1))


def p_value(u: float, m: int, n: int) -> float:
    """Two-sided Mann-Whitney p of U = ``u`` (no ties), as the warehouse's compare_samples."""
    return _p_table(m, n)[round(2 * u)]


def can_decide(m: int, n: int, level: float = ALPHA) -> bool:
    """Whether m against n values can reach p <= ``level`` at all (all of x beyond all of ref)."""
    return m >= 1 and n >= 1 and p_value(m * n, m, n) <= level + 1e-12


def _paths(lo: int, hi: int, draws: int, seed: int, ratio: float = 1.0,
           sigma: float = 0.0) -> list[list[float]]:
    """Per draw, the p-value at each look lo .. hi of two cells given one new value each per
    look: uniform values (no difference) when ``sigma`` is 0, else log-normal with the given
    log-scale ``sigma`` and x ``ratio`` times ref.  Signed: negative when x is the smaller."""
    rng = random.Random(seed)
    out = []
    log_ratio = math.log(ratio)
    for _ in range(draws):
        xs: list[float] = []
        ys: list[float] = []
        u = 0.0
        ps = []
        for k in range(1, hi + 1):
            if sigma > 0:
                x = log_ratio + rng.gauss(0.0, sigma)
                y = rng.gauss(0.0, sigma)
            else:
                x, y = rng.random(), rng.random()
            u += bisect.bisect_left(ys, x)           # new x beats the earlier refs below it
            u += len(xs) - bisect.bisect_right(xs, y)  # earlier x above the new ref
            u += 1.0 if x > y else 0.0
            bisect.insort(xs, x)
            bisect.insort(ys, y)
            if k >= lo:
                p = p_value(u, k, k)
                ps.append(p if u >= k * k / 2 else -p)
        out.append(ps)
    return out


@dataclass(frozen=True)
class Design:
    """The repeats of a sweep: ``min`` = ``max`` is a fixed design; ``level`` is the nominal
    level of every look, ``fpr`` the simulated chance that an A/A comparison is called."""

    min: int
    max: int
    level: float
    fpr: float

    @property
    def adaptive(self) -> bool:
        return self.max > self.min


@lru_cache(maxsize=None)
def design(lo: int, hi: int, alpha: float = ALPHA, draws: int = DRAWS, seed: int = SEED) -> Design:
    """The design of ``repeats = { min = lo, max = hi }``: the largest achievable nominal level
    whose simulated chance of calling an A/A comparison at any look is at most ``alpha``."""
    if not 1 <= lo <= hi:
        raise ValueError(f"expected 1 <= min <= max, got min {lo}, max {hi}")
    if hi > MAX_ADAPTIVE and hi > lo:
        raise ValueError(f"an adaptive design goes to at most {MAX_ADAPTIVE} repeats, got max {hi}")
    if lo == hi:
        return Design(lo, hi, alpha, alpha)
    smallest = sorted(min(abs(p) for p in ps) for ps in _paths(lo, hi, draws, seed))
    # the p-values the looks can give (U a whole number: no ties)
    candidates = sorted({p for k in range(lo, hi + 1) for p in _p_table(k, k)[::2] if p <= alpha + 1e-12})
    level, fpr = 0.0, 0.0
    for c in candidates:  # the share of draws whose smallest p is <= c, rising with c
        share = bisect.bisect_right(smallest, c + 1e-12) / draws
        if share > alpha:
            break
        level, fpr = c, share
    return Design(lo, hi, level, fpr)


@dataclass(frozen=True)
class Power:
    """The procedure of a design on values with a true ``ratio`` and coefficient of variation
    ``cv``: ``power`` the share of draws it called in the right direction, ``wrong`` in the
    wrong one, ``mean_repeats`` the repeats a side it used on average."""

    ratio: float
    cv: float
    power: float
    wrong: float
    mean_repeats: float


def simulate(d: Design, ratio: float, cv: float, draws: int = 4000, seed: int = SEED + 1) -> Power:
    """Run design ``d`` (stop at the first look with p <= level, else at max) on log-normal
    values: x has ``ratio`` times ref's median, both the coefficient of variation ``cv``."""
    sigma = math.sqrt(math.log1p(cv * cv)) if cv > 0 else 1e-9
    right = wrong = 0
    used = 0
    for ps in _paths(d.min, d.max, draws, seed, ratio=ratio, sigma=sigma):
        for i, p in enumerate(ps):
            if abs(p) <= d.level + 1e-12:
                if (math.copysign(1.0, p) > 0) == (ratio >= 1):  # (a p of 0 keeps its sign: -0.0)
                    right += 1
                else:
                    wrong += 1
                used += d.min + i
                break
        else:
            used += d.max
    return Power(ratio, cv, right / draws, wrong / draws, used / draws)


def repeats_needed(ratio: float, cv: float, target: float = 0.8, ceiling: int = 100,
                   draws: int = 2000) -> int | None:
    """The fewest repeats a side for which a fixed design detects ``ratio`` with probability
    ``target`` at the given ``cv`` (None: not within ``ceiling``)."""
    lo, hi = 2, ceiling
    if simulate(design(hi, hi), ratio, cv, draws).power < target:
        return None
    while lo < hi:  # power rises with the repeats (up to simulation noise)
        mid = (lo + hi) // 2
        if simulate(design(mid, mid), ratio, cv, draws).power >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


#: Futility: an undecided comparison whose projected power at ``max`` is below this gets no
#: more repeats (non-binding: stopping early for futility can only lower the false-positive
#: rate; it costs some power, measured in benchmarks/sequential_error.py).
FUTILITY = 0.2
#: Futility is judged from this many repeats a side on (a 4-against-4 interval is the full range
#: of the pairwise ratios, too wide to say much).
FUTILITY_FROM = 6


def _k_interval(m: int, n: int) -> int:
    """The rank k of the Hodges-Lehmann interval of m against n values (the warehouse's
    ratio_ci_rank): the largest k with P(U <= k-1) <= 0.025, exact up to 16 values."""
    if m + n <= EXACT_TOTAL:
        counts = _u_counts(m, n)
        total = sum(counts)
        k, below = 1, 0
        for u, c in enumerate(counts):  # P(U <= u) for u = 0, 1, ...
            below += c
            if below / total <= 0.025:
                k = u + 1
            else:
                break
        return k
    sigma = math.sqrt(m * n * (m + n + 1) / 12.0)
    return max(1, math.floor(m * n / 2.0 + 0.5 - 1.959964 * sigma))


def ratio_interval(x: list[float], ref: list[float]) -> tuple[float, float] | None:
    """The Hodges-Lehmann interval of the ratio x / ref on the log scale (as ratio_ci): None
    without positive values on both sides."""
    if not x or not ref or any(v <= 0 for v in [*x, *ref]):
        return None
    d = sorted(math.log(a) - math.log(b) for a in x for b in ref)
    k = _k_interval(len(x), len(ref))
    return math.exp(d[k - 1]), math.exp(d[len(d) - k])


def futile(low: float | None, high: float | None, n: int, hi: int, level: float) -> bool:
    """Whether a comparison undecided after ``n`` repeats a side, with the ratio interval
    [``low``, ``high``] (about 95 %), cannot be expected to decide by ``hi`` repeats: its power
    at ``hi``, projected from the interval's centre and width (the standard error shrinking as
    1/sqrt(n)), is below FUTILITY.  Never before FUTILITY_FROM repeats or without an interval."""
    if n < FUTILITY_FROM or n >= hi or low is None or high is None or not 0 < low <= high:
        return False
    half = (math.log(high) - math.log(low)) / 2
    if half <= 0:
        return False
    centre = abs(math.log(high) + math.log(low)) / 2
    se_at_max = half / 1.959964 * math.sqrt(n / hi)
    z_level = _normal_quantile(1 - level / 2)
    power = 0.5 * math.erfc(-(centre / se_at_max - z_level) / math.sqrt(2))
    return power < FUTILITY


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (bisection on erfc; a plan-time helper, not a hot path)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
