"""How far a sweep has got and how long the rest should take: what its progress line shows.

Pure: the sweep's events go in (:meth:`SweepProgress.started`, :meth:`SweepProgress.ended`),
counts and estimates come out; the seconds the current run has been going are given by the
caller, so nothing here reads a clock.

The estimate is the plan's (``matrun plan``'s): each run takes the median wall time of the
earlier ok runs of its cell, a cell that never ran the mean of the others
(``runner/planning/history.py``).  What is left is that sum over the runs not yet ended, the
current run counted down by the time it has been going (never below nothing).  When no cell
ran before, the runs this sweep has ended stand in: their mean wall time per run left.  The
asynchronous (Slurm) loop runs many cells at once, so it gives no estimate (``expected`` None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass
class SweepProgress:
    """A sweep's runs ended so far out of ``total``, and the time its other runs should take.

    ``expected``: cell id → the seconds a run of that cell should take, for every cell the
    sweep runs (empty when no cell ran before; None when runs go in parallel: no estimate);
    ``estimate_s``: the plan's estimate of all ``total`` runs (None when no cell ran before).
    """

    total: int
    expected: Mapping[str, float] | None = None
    estimate_s: float | None = None
    done: int = 0
    current: str | None = None  # the cell id of the run going now
    _measured: list[float] = field(default_factory=list, init=False)

    def started(self, cell_id: str) -> None:
        """A run of ``cell_id`` begins."""
        self.current = cell_id

    def added(self, cell_id: str) -> None:
        """One more run of ``cell_id`` than the plan said (a busy run's repeat run again)."""
        self.total += 1
        if self.estimate_s is not None and self.expected:
            self.estimate_s += self.expected.get(cell_id, 0.0)

    def ended(self, cell_id: str, wall_seconds: float | None) -> None:
        """A run of ``cell_id`` ended after ``wall_seconds``, or (None) counts as done without
        running here (another sweep ran it meanwhile)."""
        self.done += 1
        if self.estimate_s is not None and self.expected:
            self.estimate_s = max(self.estimate_s - self.expected.get(cell_id, 0.0), 0.0)
        if wall_seconds is not None:
            self._measured.append(wall_seconds)
        if cell_id == self.current:
            self.current = None

    def left(self, running_s: float = 0.0) -> float | None:
        """Seconds the runs not ended should still take, the current one ``running_s`` in;
        None when nothing says (no earlier run and none ended yet, or runs in parallel)."""
        if self.expected is None:
            return None
        if self.estimate_s is not None and self.expected:
            current = self.expected.get(self.current, 0.0) if self.current else 0.0
            return max(self.estimate_s - min(running_s, current), 0.0)
        if not self._measured:
            return None
        mean = sum(self._measured) / len(self._measured)
        remaining = max(self.total - self.done, 0)
        return max(remaining * mean - (min(running_s, mean) if self.current else 0.0), 0.0)
