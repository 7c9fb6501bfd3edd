"""The sweep's asynchronous loop (an ``AsyncExecutor``: slurm), and ``matrun cancel``.

``run_sweep`` (``runner/sweep/run.py``) plans the sweep and hands an asynchronous executor's
runs to ``run_async``: every run's directory and ``spec.json`` are written, the executor submits
them (``runner/slurm/executor.py``), and the loop then polls — ingesting each run as its
``result.json`` appears — until none is queued or running (or returns at once with ``detach``).
Runs still queued or running from an earlier (detached) sweep are waited for too.  Ctrl-C /
SIGTERM cancels the sweep's jobs (``scancel``), waits until their tasks have stopped their
containers, records what ran as cancelled and re-raises.

``cancel_sweep`` (``matrun cancel``) does the same for a sweep that no ``matrun sweep`` waits on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from matrun.errors import SweepLocked
from matrun.runner.executors.protocol import AsyncExecutor, JobTracker, PreparedRun, RunOutcome, TrackedRun
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.environments.releases import env_variant
from matrun.runner.planning.matrix import Matrix, load_matrix
from matrun.runner.slurm.jobs import SweepJobs
from matrun.runner.sweep.records import (
    INGEST_WAIT_S, SweepEvent, SweepSummary, ingest_quietly, prepare_run, sweep_lock,
)
from matrun.warehouse.bundles.layout import RESULT
from matrun.warehouse.ingest import ingest

FILE_POLL_S = 0.5  # how often run directories are looked at for a new result.json
CANCEL_WAIT_S = 180.0  # how long to wait for cancelled tasks to stop their containers


def run_async(runner: AsyncExecutor, jobs: JobTracker, matrix: Matrix, todo: list[tuple[PlannedCell, int]],
              done: dict[tuple[str, int], dict[str, Any]], data_dir: Path, summary: SweepSummary,
              emit: Callable[[SweepEvent], None], *, detach: bool,
              after_submit: Callable[[], None] = lambda: None,
              waiting_for: frozenset[tuple[str, int]] = frozenset()) -> SweepSummary:
    """Submit ``todo`` through an asynchronous executor, then (unless ``detach``) ingest every run
    of the sweep's submissions as it finishes until none is queued or running.  ``after_submit``
    is called once the submissions are recorded (the sweep releases its submit claim there).
    ``waiting_for``: the (cell, repeat) of earlier submissions the plan found in flight; one that
    ended since is reported here, not taken for one that had ended before."""
    sweep_dir = matrix.sweep.results / matrix.sweep.name
    cells = {pc.cell_id: pc for pc, _ in todo}
    reported: set[Path] = set()
    try:
        if todo:
            runner.prepare({(pc.params["framework"], env_variant(pc.params)) for pc, _ in todo},
                           log=lambda text: emit(SweepEvent("message", text)))
            runs = []
            for pc, repeat in todo:
                earlier = done.get((pc.cell_id, repeat), {}).get("max_attempt") or 0
                key, run_dir = prepare_run(matrix, pc, repeat, earlier, data_dir)
                runs.append(PreparedRun(key, run_dir, pc.params))
            submitted = runner.submit(sweep_dir, matrix.sweep.name, runs, on_submitted=jobs.add,
                                      log=lambda text: emit(SweepEvent("message", text)))
            summary.submitted = len(runs)
            summary.job_ids = [s.job_id for s in submitted]
        after_submit()
        if detach:
            summary.detached = True
            return summary
        views = jobs.refresh(max_age=0)
        reported = {v.run_dir for v in views if v.phase in ("finished", "dropped")
                    and (v.cell_id, v.repeat) not in waiting_for}
        announced: set[Path] = set()
        poll = runner.settings.poll_interval
        while True:
            fresh = [v for v in views if v.phase in ("finished", "dropped") and v.run_dir not in reported]
            finished = [v for v in fresh if v.phase == "finished"]
            if finished:
                ingest_quietly([v.run_dir for v in finished], matrix.sweep.warehouse, summary)
            for v in fresh:
                reported.add(v.run_dir)
                if v.phase == "finished":
                    _report_finished(v, cells, summary, emit)
            for v in views:
                if v.phase == "running" and v.run_dir not in announced:
                    announced.add(v.run_dir)
                    emit(SweepEvent("run-start", cell=_cell_of(v, cells), repeat=v.repeat))
            if not any(v.phase in ("queued", "running", "ending") for v in views):
                break  # ("unknown": another user's or cluster's job, not waited for, never resubmitted)
            time.sleep(FILE_POLL_S)
            views = jobs.refresh(max_age=poll)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: the jobs go too, and what ran is recorded
        emit(SweepEvent("message", "interrupted: cancelling the sweep's Slurm jobs (their tasks stop their "
                                   "containers) …"))
        cancelled = jobs.cancel()
        ended = jobs.wait_ended(CANCEL_WAIT_S)
        views = jobs.refresh(max_age=0)
        finished_dirs = [v.run_dir for v in views if v.phase == "finished" and v.run_dir not in reported]
        if finished_dirs:
            ingest_quietly(finished_dirs, matrix.sweep.warehouse, summary)
        note = "" if ended else f"; some tasks were still ending after {CANCEL_WAIT_S:.0f} s (see squeue)"
        emit(SweepEvent("message", f"cancelled job(s) {', '.join(cancelled) or 'none'}{note}"))
        raise
    summary.warnings.extend(w for w in jobs.warnings if w not in summary.warnings)
    return summary


def _report_finished(view: TrackedRun, cells: dict[str, PlannedCell], summary: SweepSummary,
                     emit: Callable[[SweepEvent], None]) -> None:
    try:
        result = json.loads((view.run_dir / RESULT).read_text())
    except (OSError, ValueError):
        return
    outcome = RunOutcome(status=result["status"], exit_code=result.get("exit_code"),
                         error_tail=result.get("error_tail") or "", started_at=result.get("started_at") or "",
                         ended_at=result.get("ended_at") or "", wall_seconds=float(result.get("wall_seconds") or 0))
    summary.count(outcome.status)
    emit(SweepEvent("run-end", cell=_cell_of(view, cells), repeat=view.repeat, outcome=outcome))


def _cell_of(view: TrackedRun, cells: dict[str, PlannedCell]) -> PlannedCell:
    """The planned cell of a recorded task; one submitted by an earlier sweep (not in this
    selection) is described by its id."""
    pc = cells.get(view.cell_id)
    return pc if pc is not None else PlannedCell(_Unnamed(view.cell_id), view.cell_id, "")


@dataclass(frozen=True)
class _Unnamed:
    cell_id: str

    @property
    def label(self) -> str:
        return f"(cell {self.cell_id}, submitted earlier)"

    @property
    def values(self) -> dict[str, Any]:
        return {}


def cancel_sweep(*, matrix_path: Path, wait_s: float = CANCEL_WAIT_S,
                 on_message: Callable[[str], None] = lambda text: None,
                 profile: str | None = None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``matrun cancel``: scancel the sweep's recorded Slurm jobs, wait until their tasks have
    stopped their containers, record what ran as cancelled and ingest it (unless a running
    ``matrun sweep`` holds the sweep: it does that itself).  ``overrides`` (``--set``) are
    checked as the sweep's were; they do not change which sweep it is."""
    matrix = load_matrix(matrix_path, profile, overrides)
    sweep_dir = matrix.sweep.results / matrix.sweep.name
    jobs = SweepJobs(sweep_dir, matrix.slurm)
    outcome: dict[str, Any] = {"sweep": matrix.sweep.name, "job_ids": [], "ended": True, "recorded": 0,
                               "left": 0}
    if not jobs.submissions:
        return outcome
    outcome["job_ids"] = jobs.cancel()
    if outcome["job_ids"]:
        on_message(f"scancel {' '.join(outcome['job_ids'])}; waiting for the tasks to stop their containers …")
        outcome["ended"] = jobs.wait_ended(wait_s)
    try:
        with sweep_lock(sweep_dir, matrix.sweep.name):
            views = jobs.refresh(max_age=0)
            recorded = [v.run_dir for v in views if v.phase == "finished" and v.status == "cancelled"]
            outcome["recorded"] = len(recorded)
            if any(v.phase == "finished" for v in views):
                ingest([sweep_dir], warehouse=matrix.sweep.warehouse, wait_s=INGEST_WAIT_S)
    except SweepLocked:
        views = jobs.refresh(max_age=0, record=False)
        on_message("a matrun sweep of this sweep is waiting on the jobs: it records and ingests the cancelled runs")
    outcome["left"] = sum(1 for v in views if v.phase in ("queued", "running"))
    return outcome
