"""Runs that started on a busy machine, run again (``[sweep] rerun_busy`` and ``busy_reruns``;
docs/MATRIX.md "Busy runs").

A run's ``result.json`` records the machine just before it started (``host.state``,
runner/sweep/machine.py); ``busy`` is true when other processes used the cell's CPUs.  With
``rerun_busy`` on, a repeat whose run ended ok but started busy is run again as a new attempt
(the busy run's bundle stays on disk and in the warehouse), until a run starts clean or
``busy_reruns`` re-runs were made.  The verdicts then set the busy runs aside while a clean ok
run of the same (cell, repeat) exists (views/cell_facts_live.sql), so a re-run replaces the
busy measurement rather than adding to it.  Cell ids are untouched: a re-run is an attempt.

``busy_start`` is read from the bundle as the warehouse reads it (warehouse/rows.py: a JSON
``true`` at ``host.state.busy``), not from the warehouse, which the ingest queue may fill later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from matrun.runner.executors.protocol import RunOutcome
from matrun.warehouse.bundles.layout import RESULT


def _state(run_dir: Path) -> dict[str, Any]:
    """result.json ``host.state`` of a run ({} when the file or the field cannot be read)."""
    try:
        result = json.loads((run_dir / RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    host = result.get("host") if isinstance(result, dict) else None
    state = host.get("state") if isinstance(host, dict) else None
    return state if isinstance(state, dict) else {}


def started_busy(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` started on a busy machine (``runs.busy_start`` true)."""
    return _state(run_dir).get("busy") is True


def busy_reasons(run_dir: Path) -> list[str]:
    """Why the machine counted as busy when the run started (result.json ``busy_reasons``)."""
    reasons = _state(run_dir).get("busy_reasons")
    return [r for r in reasons if isinstance(r, str)] if isinstance(reasons, list) else []


def rerun_limit(rerun_busy: bool, busy_reruns: int) -> int:
    """Re-runs a repeat may get when it starts busy: ``busy_reruns``, or 0 with ``rerun_busy`` off."""
    return busy_reruns if rerun_busy else 0


@dataclass(frozen=True)
class Ran:
    """The last run of a repeat (``outcome``, ``run_dir``), how many busy re-runs came before
    it and whether it started busy too."""

    outcome: RunOutcome
    run_dir: Path
    reruns: int
    busy: bool


def run_until_clean(run_once: Callable[[], tuple[RunOutcome, Path]], limit: int, *,
                    again: Callable[[RunOutcome, Path, int], None]) -> Ran:
    """Run one repeat (``run_once``: a new attempt each call) and run it again while its run
    ended ok but started busy, at most ``limit`` times.  ``again(outcome, run_dir, n)`` is told
    of each busy run before re-run ``n`` (1 to ``limit``) starts; the last run is returned.  A
    run that did not end ok is never re-run here: it leaves the repeat to be done, as before."""
    reruns = 0
    while True:
        outcome, run_dir = run_once()
        busy = outcome.status == "ok" and started_busy(run_dir)
        if not busy or reruns >= limit:
            return Ran(outcome, run_dir, reruns, busy)
        reruns += 1
        again(outcome, run_dir, reruns)
