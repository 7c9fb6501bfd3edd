"""Two modes in repeated measurements: the bimodality rule of macro ``two_modes``
(views/_macros.sql), in Python, for what reads no warehouse (benchmarks/harness_overhead.py).

On this VM a bare process lands in one of two speeds for its whole life (a LeNet-5 step at
5 or at 8 ms, ../shared/DESIGN.md): repeats of one cell then split into two groups, and one
median with a wide interval describes neither.  The rule (docs/WAREHOUSE.md "Bimodal cells"):
sort the values; split them at their largest gap that leaves at least two values on each
side; they are bimodal when that gap is more than ``GAP_OVER_SPREAD`` times the wider side's
range *and* more than ``GAP_OVER_MEDIAN`` of the median.  Fewer than four values: no verdict.
Imports nothing of matrun (tests/test_modes.py checks it against the SQL macro).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable

#: The gap must exceed this many times the wider group's range (max − min)...
GAP_OVER_SPREAD = 3.0
#: ... and this share of the median of all the values.
GAP_OVER_MEDIAN = 0.10
#: Fewer values than this get no verdict (two per mode at least).
MIN_VALUES = 4
#: Repeats whose coefficient of variation is above this are noisy (the views' ``cv > 0.05``:
#: ``throughput_noisy``, compare's and advise's notes; the report's flags; tune's notes).
NOISY_CV = 0.05


@dataclass(frozen=True)
class Modes:
    """The split of some values at their largest gap, and whether it makes two modes."""

    bimodal: bool
    low: tuple[float, ...]  # the values below the gap, sorted
    high: tuple[float, ...]  # the values above it, sorted
    gap: float
    spread: float  # the wider side's range

    @property
    def threshold(self) -> float:
        """The middle of the gap: a value below it is in the low mode."""
        return (self.low[-1] + self.high[0]) / 2

    @property
    def low_median(self) -> float:
        return statistics.median(self.low)

    @property
    def high_median(self) -> float:
        return statistics.median(self.high)


def two_modes(values: Iterable[float | None]) -> Modes | None:
    """The rule over ``values`` (None values left out); None for fewer than four values."""
    v = sorted(x for x in values if x is not None)
    if len(v) < MIN_VALUES:
        return None
    # k: how many values lie below the gap, from 2 to len - 2; the first largest gap wins
    k = max(range(2, len(v) - 1), key=lambda i: (v[i] - v[i - 1], -i))
    gap = v[k] - v[k - 1]
    spread = max(v[k - 1] - v[0], v[-1] - v[k])
    bimodal = gap > GAP_OVER_SPREAD * spread and gap > GAP_OVER_MEDIAN * statistics.median(v)
    return Modes(bimodal, tuple(v[:k]), tuple(v[k:]), gap, spread)
