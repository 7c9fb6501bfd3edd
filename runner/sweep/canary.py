"""The drift canary of a sweep (``[sweep] canary``, docs/MATRIX.md "Drift canary"): which
cell, and when.

A canary run is a real run of one reference cell, under the sweep's executor, at the start
of the sweep, after every ``every`` of its runs and at its end, so that view
``canary_drift`` shows how the machine's speed moved through the sweep and view
``run_drift`` flags the runs measured while it had drifted beyond its spread.  It is
repeat ``CANARY_REPEAT`` of the reference cell (warehouse/bundles/layout.py), a repeat no
sweep plans: a canary run never makes a (cell, repeat) done and never enters the cell's
statistics, and its attempts, numbered per results directory like every run's, keep its
run id unique.  Its spec.json ``canary`` is its number within the sweep run that made it.
Pure: ``runner/sweep/run.py`` runs what this plans.  The slurm executor refuses a canary
(``SLURM_REFUSAL``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from matrun.errors import InputError
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.planning.matrix import CanarySettings
from matrun.runner.planning.selection import parse_where, select

#: Without ``every``, the runs to do are cut into about this many intervals (a canary at the
#: start, one after each interval, one at the end).
DEFAULT_INTERVALS = 8

SLURM_REFUSAL = ("[sweep -> canary] is for the local and docker executors: the slurm executor starts "
                 "runs on several nodes in any order, so a canary there tracks no machine the other "
                 "runs ran on; run this sweep with --executor local or docker, or set canary = false")


@dataclass
class Canary:
    """The canary runs of one sweep: before the run at each index that is a multiple of
    ``every`` (0 included) among the ``runs`` to do, and one after the last."""

    cell: PlannedCell
    every: int
    runs: int
    made: int = 0

    @property
    def count(self) -> int:
        """How many canary runs the sweep makes."""
        return -(-self.runs // self.every) + 1

    def due(self, index: int) -> bool:
        """Whether a canary run comes before the sweep's run at ``index`` (from 0)."""
        return index % self.every == 0

    def next(self) -> int:
        """The number of the next canary run (from 1)."""
        self.made += 1
        return self.made


def reference_cell(settings: CanarySettings, matrix_path: Path, every_cell: Sequence[PlannedCell],
                   cells: Sequence[PlannedCell]) -> PlannedCell:
    """The canary's cell: the first cell of the matrix its ``where`` matches, else the first of
    the cells the sweep runs (``cells``, never empty)."""
    if not settings.where:
        return cells[0]
    try:
        return select(every_cell, parse_where(settings.where))[0]
    except InputError:  # checked when the matrix was read: here only "matches no cell"
        raise InputError(f"{matrix_path.name}: [sweep -> canary -> where] {', '.join(settings.where)} "
                         "matches no cell of the matrix") from None


def schedule(settings: CanarySettings | None, cell: PlannedCell | None, runs: int) -> Canary | None:
    """The canary runs among ``runs`` runs to do; None without a canary or with nothing to do."""
    if settings is None or cell is None or runs == 0:
        return None
    every = settings.every or max(1, round(runs / DEFAULT_INTERVALS))
    return Canary(cell, every, runs)
