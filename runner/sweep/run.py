"""Running a sweep: what is not done yet, each run ingested as it finishes (or, when runs are
shorter than the ingest is worth, with the next runs: ``IngestQueue``).

Resumability comes from the bundles on disk: before running, the sweep ingests whatever
bundles its results directory already holds, so a warehouse that was deleted or missed an
ingest is caught up; then every (cell, repeat) without an ok run is run as a new attempt.
A run's bundle is complete (``result.json`` written) before it is ingested, so a failure of
the warehouse loses nothing: ``matrun ingest`` picks the bundle up later.

Sweeps that share a results directory share its runs (docs/BUNDLE.md, "Runs shared by
sweeps"): a (cell, repeat) with an ok run in another sweep's folder is done (that bundle is
ingested, not run again), and a synchronous sweep runs a (cell, repeat) only while it holds its
``RunClaim`` — one that another sweep holds is left for the end, then waited for and looked at
again.  A full disk, or any ``OSError`` of the sweep's own files, stops the sweep with
``SweepStopped`` (``Error: no space left on device: PATH``): the run in flight is recorded when
its ``result.json`` can still be written, every finished run stays, and the next sweep, once
there is space, goes on from there.

The loop follows the executor's kind (``runner/executors/protocol.py``).  A ``SyncExecutor``
(local, docker) runs one cell at a time here.  An ``AsyncExecutor`` (slurm) gets every run at
once and is waited on by the asynchronous loop, ``runner/slurm/loop.py``; runs already queued or
running from an earlier (detached) sweep are waited for, never submitted again.  With
``[sweep] canary`` the synchronous loop also runs the canary's reference cell at the start, at
intervals and at the end (``runner/sweep/canary.py``); the slurm executor refuses a canary.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from matrun.errors import InputError, MatrunError, SweepLocked
from matrun.runner.executors.outcomes import RunAborted, cancelled_outcome
from matrun.runner.executors.protocol import AsyncExecutor, Executor, RunOutcome, RunRequest, SyncExecutor
from matrun.runner.executors.orphans import reap_orphans
from matrun.runner.executors.registry import get_executor
from matrun.runner.harness.cpusets import parse_cpuset
from matrun.runner.planning.history import done_runs, durations
from matrun.runner.planning.identity import PlannedCell, plan_cells
from matrun.runner.environments.releases import env_variant
from matrun.runner.planning.preflight import preflight, preflight_data, preflight_study, resolve_data_dir
from matrun.runner.planning.selection import parse_where, select
from matrun.runner.planning.studies import record_study
from matrun.runner.planning.matrix import Matrix, load_matrix
from matrun.runner.slurm.loop import run_async
from matrun.runner.sweep.records import (
    INGEST_WAIT_S, IngestQueue, RunClaim, SubmitClaim, SweepEvent, SweepStopped, SweepSummary, host_info, ingest_quietly, ok_runs_on_disk,
    path_error, prepare_run, sweep_lock, with_state, write_result,
)
from matrun.runner.planning.sequential import FUTILITY, futile
from matrun.runner.sweep.adaptive import describe, design_record, sweep_design, undecided
from matrun.runner.sweep.busy import busy_reasons, rerun_limit, run_until_clean
from matrun.runner.sweep.canary import SLURM_REFUSAL, Canary, reference_cell, schedule
from matrun.runner.sweep.machine import LoadWatch, noise_warnings
from matrun.warehouse.bundles.layout import CANARY_REPEAT
from matrun.warehouse.bundles.read import load_bundle
from matrun.warehouse.ingest import ingest

#: After a run that did not end ok, less free space than this under the results directory
#: means the disk is full: the sweep stops rather than fail every cell after it.
LOW_SPACE_BYTES = 1 << 20


def run_sweep(*, matrix_path: Path, where: Sequence[str] = (), force: bool = False,
              executor: str | None = None, on_event: Callable[[SweepEvent], None] | None = None,
              detach: bool = False, slurm: Mapping[str, Any] | None = None,
              profile: str | None = None, overrides: Mapping[str, Any] | None = None,
              skip_unrunnable: bool = False, rerun_busy: bool | None = None,
              repeats: Mapping[str, Any] | None = None, canary: bool = True,
              register: bool = True) -> SweepSummary:
    """Run (or, for slurm, submit) every selected (cell, repeat) without an ok run.

    ``profile``: the matrix's ``[profiles.<name>]`` to apply; ``overrides``: the ``--set``
    values applied after it (``matrix.apply_overrides``).  Selected cells the executor cannot
    run (``refusal``: a site Python without the cell's framework, say) are refused together,
    by name, before anything runs; with ``skip_unrunnable`` they are left out instead, listed
    in ``summary.unrunnable``, and the others run.  A study file's declaration
    (``[study]``, its findings and the profile's cells) is recorded in the warehouse before
    anything runs, so the ``findings`` view can judge the study's cells.

    ``rerun_busy``: overrides ``[sweep] rerun_busy`` (None: the matrix's; a study file's default
    is on): a repeat whose ok run started on a busy machine runs again, up to ``[sweep]
    busy_reruns`` times (runner/sweep/busy.py; local and docker executors).

    ``repeats``: ``--repeats`` / ``--max-time`` (SweepSettings fields: ``repeats``,
    ``repeats_max``, ``max_time``; matrix.repeats_option); an adaptive design
    (``repeats_max``) adds repeats to undecided verdicts' cells (runner/sweep/adaptive.py).

    ``canary``: False runs no ``[sweep] canary`` runs; ``register``: False leaves a study
    file's declaration in the warehouse as it is (``matrun tune`` and ``bisect`` run single
    cells of a study's space, not its profile).

    ``slurm``: overrides of the matrix's ``[slurm]`` settings (``SlurmSettings`` field names;
    ``None`` values are ignored).  ``detach``: slurm only, return once submitted.  Raises
    ``SweepStopped`` (with the summary so far) when the sweep stops after it has begun.
    """
    try:
        return _run_sweep(matrix_path=matrix_path, where=where, force=force, executor=executor,
                          emit=on_event or (lambda event: None), detach=detach, slurm=slurm, profile=profile,
                          sets=overrides, skip_unrunnable=skip_unrunnable, rerun_busy=rerun_busy,
                          repeats=repeats, canary=canary, register=register)
    except OSError as exc:  # a path of the sweep's the system refused, before anything ran
        raise path_error(exc) from None


def _run_sweep(*, matrix_path: Path, where: Sequence[str], force: bool, executor: str | None,
               emit: Callable[[SweepEvent], None], detach: bool,
               slurm: Mapping[str, Any] | None, profile: str | None = None,
               sets: Mapping[str, Any] | None = None, skip_unrunnable: bool = False,
               rerun_busy: bool | None = None, repeats: Mapping[str, Any] | None = None,
               canary: bool = True, register: bool = True) -> SweepSummary:
    matrix = load_matrix(matrix_path, profile, sets)  # sets: the --set values
    if not canary:
        matrix = replace(matrix, sweep=replace(matrix.sweep, canary=None))
    if rerun_busy is not None:  # --rerun-busy / --no-rerun-busy
        matrix = replace(matrix, sweep=replace(matrix.sweep, rerun_busy=rerun_busy))
    if repeats:  # --repeats N | MIN..MAX, --max-time
        matrix = replace(matrix, sweep=replace(matrix.sweep, **repeats))
    filters = parse_where(where)
    name = executor or matrix.sweep.executor
    overrides = {k: v for k, v in (slurm or {}).items() if v is not None and v != () and v != []}
    if name != "slurm" and (overrides or detach):
        flags = ", ".join(["--detach"] * detach + [f"--{k.replace('_', '-')}" for k in overrides])
        raise InputError(f"{flags}: only for --executor slurm (this sweep's executor is {name})")
    if name == "slurm" and matrix.sweep.repeats_max:
        raise InputError(f"[sweep] repeats = {{ min = {matrix.sweep.repeats}, max = {matrix.sweep.repeats_max} }}: "
                         "adaptive repeats need the local or docker executor (they look at the verdicts between "
                         "rounds; a Slurm sweep submits every run at once); give a fixed count for Slurm")
    settings = matrix.slurm.merged(overrides) if name == "slurm" else None
    runner, picked = get_executor(name, slurm=settings)
    emit(SweepEvent("message", picked))
    every_cell = plan_cells(matrix, runner.env_id)
    cells = select(every_cell, filters)
    summary = SweepSummary(sweep=matrix.sweep.name, executor=runner.name)
    cells, summary.unrunnable = _runnable(cells, runner, skip=skip_unrunnable)
    for line in summary.unrunnable:
        emit(SweepEvent("message", f"skipped, cannot run here (--skip-unrunnable): {line}"))
    canary_cell = _canary_cell(matrix, runner, every_cell, cells)  # [sweep] canary's cell, or None
    extra_cell = canary_cell is not None and canary_cell.cell_id not in {pc.cell_id for pc in cells}
    checked = [*cells, canary_cell] if extra_cell else cells  # the canary's cell is checked too
    data_dir = resolve_data_dir(matrix)
    if isinstance(runner, AsyncExecutor):  # cpusets and GPUs are the nodes', not this host's
        preflight_data(cells, data_dir)
    else:
        preflight_study(matrix, cells)
        preflight(checked, data_dir)
    _check_enforced(checked, runner)
    _check_refusals(checked[len(cells):], runner)  # the canary's own cell, when it is not one of them
    sweep_dir = matrix.sweep.results / matrix.sweep.name
    sweep_dir.mkdir(parents=True, exist_ok=True)

    with sweep_lock(sweep_dir, matrix.sweep.name):
        try:
            if matrix.study is not None and register:
                record_study(matrix, every_cell)
            return _locked(runner, matrix, cells, data_dir, force, detach, summary, emit, canary_cell=canary_cell)
        except SweepLocked:
            raise
        except OSError as exc:  # a full disk, a path the system refuses: what ran is kept
            raise SweepStopped(path_error(exc), summary) from None
        except SweepStopped:
            raise
        except MatrunError as exc:  # the warehouse, mostly: every bundle is on disk
            raise SweepStopped(exc, summary) from None


def _locked(runner: Executor, matrix: Matrix, cells: Sequence[PlannedCell], data_dir: Path, force: bool,
            detach: bool, summary: SweepSummary, emit: Callable[[SweepEvent], None], *,
            canary_cell: PlannedCell | None = None) -> SweepSummary:
    """The sweep, under its lock: catch up, plan what is left, run it."""
    if not isinstance(runner, AsyncExecutor):
        return _planned(runner, matrix, cells, data_dir, force, detach, summary, emit, canary_cell=canary_cell)
    # Slurm: choose and submit under the results directory's submit claim (released as soon as
    # this sweep's submissions are recorded), so a run another sweep has queued is not submitted again.
    claim = SubmitClaim(matrix.sweep.results, matrix.sweep.name)
    if not claim.take(wait=False):
        emit(SweepEvent("message", f"waiting for {claim.holder()} to finish submitting to Slurm"))
        claim.take(wait=True)
    try:
        return _planned(runner, matrix, cells, data_dir, force, detach, summary, emit, submit_claim=claim)
    finally:
        claim.release()


def _queued_elsewhere(runner: AsyncExecutor, matrix: Matrix) -> dict[tuple[str, int], str]:
    """(cell id, repeat) -> sweep, for the runs other sweeps of the results directory have
    queued or running in the scheduler (read only: nothing of theirs is written)."""
    own = matrix.sweep.results / matrix.sweep.name
    found: dict[tuple[str, int], str] = {}
    for other in sorted(matrix.sweep.results.iterdir()):
        if other == own or other.name.startswith(".") or not other.is_dir():
            continue
        for view in runner.jobs(other).refresh(record=False):
            if view.in_flight:
                found[(view.cell_id, view.repeat)] = other.name
    return found


def _claimed_elsewhere(matrix: Matrix, todo: Sequence[tuple[PlannedCell, int]]) -> dict[tuple[str, int], str]:
    """(cell id, repeat) -> holder, for the runs whose claim a local or docker sweep of the
    results directory holds right now (looked at, never waited for)."""
    found: dict[tuple[str, int], str] = {}
    for pc, repeat in todo:
        claim = RunClaim(matrix.sweep.results, pc.cell_id, repeat, matrix.sweep.name)
        if claim.take(wait=False):
            claim.release()
        else:
            found[(pc.cell_id, repeat)] = claim.holder()
    return found


def _planned(runner: Executor, matrix: Matrix, cells: Sequence[PlannedCell], data_dir: Path, force: bool,
             detach: bool, summary: SweepSummary, emit: Callable[[SweepEvent], None], *,
             submit_claim: SubmitClaim | None = None, canary_cell: PlannedCell | None = None) -> SweepSummary:
    sweep_dir = matrix.sweep.results / matrix.sweep.name
    jobs = None
    in_flight: set[tuple[str, int]] = set()
    elsewhere_queued: dict[tuple[str, int], str] = {}
    if isinstance(runner, AsyncExecutor):  # what earlier submissions still do; results Slurm decided are written
        jobs = runner.jobs(sweep_dir)
        in_flight = {(v.cell_id, v.repeat) for v in jobs.refresh() if v.in_flight}
        summary.warnings.extend(jobs.warnings)
        elsewhere_queued = _queued_elsewhere(runner, matrix)
    # containers of sweeps killed outright: stopped, their runs recorded for the catch-up
    reap_orphans(runner, log=lambda text: emit(SweepEvent("message", text)))
    _catch_up(sweep_dir, matrix, summary, emit)
    done = done_runs(matrix.sweep.warehouse)
    todo = [(pc, r) for r in range(matrix.sweep.repeats) for pc in cells
            if (force or not done.get((pc.cell_id, r), {}).get("ok")) and (pc.cell_id, r) not in in_flight]
    if isinstance(runner, AsyncExecutor):  # a local / docker sweep of the directory running one now
        elsewhere_queued.update(_claimed_elsewhere(matrix, todo))
    queued = [(pc, r) for pc, r in todo if (pc.cell_id, r) in elsewhere_queued]
    if queued:  # another Slurm sweep of the results directory runs them: left to it
        names = sorted({elsewhere_queued[(pc.cell_id, r)] for pc, r in queued})
        emit(SweepEvent("message", f"{len(queued)} runs are queued or running for other sweeps of "
                                   f"{matrix.sweep.results} ({', '.join(names)}): left to them"))
        todo = [(pc, r) for pc, r in todo if (pc.cell_id, r) not in elsewhere_queued]
    if not force:  # ok runs in other sweeps' folders of the results directory (a rebuilt warehouse)
        elsewhere = _done_on_disk(matrix, todo, summary)
        if elsewhere:
            emit(SweepEvent("message", f"{len(elsewhere)} runs were done by other sweeps of "
                                       f"{matrix.sweep.results} (ingested from their folders)"))
            todo = [(pc, r) for pc, r in todo if (pc.cell_id, r) not in elsewhere]
    summary.planned = len(cells) * matrix.sweep.repeats
    selected = {(pc.cell_id, r) for pc in cells for r in range(matrix.sweep.repeats)}
    summary.in_flight = len(in_flight)  # all of them are waited for, selected by --where or not
    summary.skipped_done = summary.planned - len(todo) - len(in_flight & selected) - len(queued)
    known = durations(matrix.sweep.warehouse)
    canary = schedule(matrix.sweep.canary, canary_cell, len(todo))  # None: no canary runs
    extra = [(canary.cell, CANARY_REPEAT)] * canary.count if canary else []
    expected = _expected(todo + extra, known)
    estimate = sum(expected[pc.cell_id] for pc, _ in todo + extra) if expected else None
    waiting = f", {summary.in_flight} already queued or running in Slurm" if summary.in_flight else ""
    waiting += f", {len(queued)} queued by other sweeps" if queued else ""
    if canary is not None:
        after = "after every run" if canary.every == 1 else f"after every {canary.every} runs"
        waiting += (f"; {canary.count} canary runs of cell {canary.cell.cell_id}: at the start, {after} "
                    "and at the end")
    limit = rerun_limit(matrix.sweep.rerun_busy, matrix.sweep.busy_reruns)
    if limit and todo and isinstance(runner, SyncExecutor):
        waiting += f"; a repeat that starts on a busy machine runs again, up to {limit} time(s)"
    emit(SweepEvent("plan", f"{len(todo)} runs to do, {summary.skipped_done} already done{waiting}",
                    total=len(todo) + len(extra) + (0 if detach else summary.in_flight), estimate_s=estimate,
                    expected=None if isinstance(runner, AsyncExecutor) else expected))
    if isinstance(runner, AsyncExecutor):
        assert jobs is not None
        return run_async(runner, jobs, matrix, todo, done, data_dir, summary, emit, detach=detach,
                         after_submit=submit_claim.release if submit_claim else (lambda: None),
                         waiting_for=frozenset(in_flight))
    assert isinstance(runner, SyncExecutor)
    if not todo and not matrix.sweep.repeats_max:  # (adaptive: undecided verdicts may want more)
        return summary
    watch = LoadWatch()  # other processes' load, measured while the sweep prepares and between runs
    may_run = [pc for pc, _ in [*todo, *extra]] + (list(cells) if matrix.sweep.repeats_max else [])
    runner.prepare({(pc.params["framework"], env_variant(pc.params)) for pc in may_run},
                   log=lambda text: emit(SweepEvent("message", text)))
    for warning in noise_warnings(_cells_cpus([*todo, *extra]), watch=watch):  # told, never changed (docs/EXECUTORS.md "Noise")
        emit(SweepEvent("message", f"Warning: {warning}"))
    host = host_info()
    began = time.monotonic()  # [sweep] repeats.max_time counts from here
    queue = IngestQueue(matrix.sweep.warehouse, summary)  # finished runs on their way into the warehouse
    later: list[tuple[PlannedCell, int, RunClaim]] = []
    try:
        for index, (pc, repeat) in enumerate(todo):
            if canary is not None and canary.due(index):
                _run_canary(runner, matrix, canary, done, data_dir, host, summary, emit, queue, watch=watch)
            claim = RunClaim(matrix.sweep.results, pc.cell_id, repeat, matrix.sweep.name)
            if claim.take(wait=False):
                _run_claimed(runner, matrix, pc, repeat, claim, done, data_dir, host, force, summary, emit, queue,
                             watch=watch)
            else:  # another sweep of this results directory runs it now: the others first
                emit(SweepEvent("message", f"cell {pc.cell_id} repeat {repeat}: running in {claim.holder()}; "
                                           "coming back to it at the end"))
                later.append((pc, repeat, claim))
        for pc, repeat, claim in later:
            if not claim.take(wait=False):
                queue.flush()  # what this sweep ran is in the warehouse while it waits
                emit(SweepEvent("message", f"waiting for {claim.holder()} to finish cell {pc.cell_id} "
                                           f"repeat {repeat} …"))
                claim.take(wait=True)
            _run_claimed(runner, matrix, pc, repeat, claim, done, data_dir, host, force, summary, emit, queue,
                         watch=watch)
        if matrix.sweep.repeats_max:  # adaptive repeats: rounds for the undecided verdicts' cells
            _adaptive_rounds(runner, matrix, cells, done, data_dir, host, force, summary, emit, queue, watch=watch,
                             began=began)
        if canary is not None:  # the last canary run, after every run of the sweep
            _run_canary(runner, matrix, canary, done, data_dir, host, summary, emit, queue, watch=watch)
    finally:  # ended, stopped or interrupted: every finished run goes in now
        queue.flush()
    return summary


def _adaptive_rounds(runner: SyncExecutor, matrix: Matrix, cells: Sequence[PlannedCell],
                     done: dict[tuple[str, int], dict[str, Any]], data_dir: Path, host: dict[str, Any],
                     force: bool, summary: SweepSummary, emit: Callable[[SweepEvent], None], queue: IngestQueue, *,
                     watch: LoadWatch | None, began: float) -> None:
    """Repeats ``min`` .. ``max - 1``: before each round, the round's runs are the undecided
    verdicts' cells without an ok run of that repeat (runner/sweep/adaptive.py)."""
    d = sweep_design(matrix)
    assert d is not None
    ids = {pc.cell_id for pc in cells}
    given_up: dict[str, Any] = {}  # futile verdicts: no more repeats for them (sequential.futile)
    for repeat in range(d.min, d.max):
        queue.flush()  # the verdicts see every run so far
        open_ = undecided(matrix.sweep.warehouse, matrix.study.id if matrix.study else None, ids)
        for u in open_:
            if u.key not in given_up and futile(u.low, u.high, repeat, d.max, d.level):
                given_up[u.key] = u
                emit(SweepEvent("message", f"adaptive repeats: no more repeats for {describe([u])} after {repeat}: "
                                           f"its projected power at {d.max} repeats is below {FUTILITY:.0%} "
                                           "(it stays undecided)"))
        futile_now = [u for u in open_ if u.key in given_up]
        open_ = [u for u in open_ if u.key not in given_up]
        if not open_:
            summary.undecided = len(futile_now)
            if futile_now:
                emit(SweepEvent("message", f"adaptive repeats: every other verdict is decided after {repeat} "
                                           f"repeats; {len(futile_now)} left undecided as futile"))
                return
            emit(SweepEvent("message", f"adaptive repeats: every verdict is decided after {repeat} repeats "
                                       f"(each look at p <= {d.level:.4f})"))
            return
        elapsed = time.monotonic() - began
        if matrix.sweep.max_time is not None and elapsed >= matrix.sweep.max_time:
            emit(SweepEvent("message", f"adaptive repeats: max_time ({matrix.sweep.max_time:g} s) reached after "
                                       f"{elapsed:.0f} s; still undecided: {describe(open_)}"))
            summary.undecided = len(open_)
            return
        wanted = {c for u in open_ for c in u.cells}
        todo = [(pc, repeat) for pc in cells if pc.cell_id in wanted
                and (force or not done.get((pc.cell_id, repeat), {}).get("ok"))]
        summary.adaptive_rounds += 1
        emit(SweepEvent("adaptive", f"adaptive repeats: repeat {repeat + 1} of at most {d.max} for {len(wanted)} "
                                    f"cell(s) of {len(open_)} undecided verdict(s): {describe(open_)}",
                        total=len(todo), expected={pc.cell_id: 0.0 for pc, _ in todo}))
        for pc, r in todo:
            claim = RunClaim(matrix.sweep.results, pc.cell_id, r, matrix.sweep.name)
            if not claim.take(wait=False):
                queue.flush()
                emit(SweepEvent("message", f"waiting for {claim.holder()} to finish cell {pc.cell_id} repeat {r} …"))
                claim.take(wait=True)
            summary.adaptive_runs += 1
            _run_claimed(runner, matrix, pc, r, claim, done, data_dir, host, force, summary, emit, queue, watch=watch)
    queue.flush()
    left = undecided(matrix.sweep.warehouse, matrix.study.id if matrix.study else None, ids)
    summary.undecided = len(left)  # (the futile ones among them too)
    if left:
        emit(SweepEvent("message", f"adaptive repeats: max ({d.max}) reached; still undecided: {describe(left)}"))
    else:
        emit(SweepEvent("message", f"adaptive repeats: every verdict is decided after {d.max} repeats"))


def _run_claimed(runner: SyncExecutor, matrix: Matrix, pc: PlannedCell, repeat: int, claim: RunClaim,
                 done: dict[tuple[str, int], dict[str, Any]], data_dir: Path, host: dict[str, Any],
                 force: bool, summary: SweepSummary, emit: Callable[[SweepEvent], None], queue: IngestQueue, *,
                 watch: LoadWatch | None = None) -> None:
    """Run (cell, repeat), whose claim this sweep holds, unless another sweep ran it meanwhile;
    the claim is released once the run is recorded (``result.json`` written: a sweep that takes
    the claim next finds the run done on disk, ingested or waiting in ``queue``)."""
    try:
        if not force and _done_on_disk(matrix, [(pc, repeat)], summary):
            summary.skipped_done += 1
            summary.done_elsewhere += 1
            emit(SweepEvent("run-skip", "done by another sweep meanwhile", cell=pc, repeat=repeat))
            return
        # Attempts count across sweeps: the same cell may have run under another results directory.
        earlier = done.get((pc.cell_id, repeat), {}).get("max_attempt") or 0
        limit = rerun_limit(matrix.sweep.rerun_busy, matrix.sweep.busy_reruns)  # 0: rerun_busy off

        def once() -> tuple[RunOutcome, Path]:
            emit(SweepEvent("run-start", cell=pc, repeat=repeat))
            return _run_one(runner, matrix, pc, repeat, earlier, data_dir, host, summary, queue, watch=watch)

        def again(outcome: RunOutcome, run_dir: Path, number: int) -> None:  # [sweep] rerun_busy
            _ended(pc, repeat, outcome, run_dir, summary, emit)
            summary.busy_reruns += 1
            why = "; ".join(busy_reasons(run_dir)) or "other processes on its CPUs"
            emit(SweepEvent("run-again", f"cell {pc.cell_id} repeat {repeat} started on a busy machine ({why}): "
                                         f"running it again, busy re-run {number} of {limit} (the busy run is kept "
                                         "and set aside once a clean run exists)", cell=pc, repeat=repeat))

        ran = run_until_clean(once, limit, again=again)
    finally:
        claim.release()
    _ended(pc, repeat, ran.outcome, ran.run_dir, summary, emit)
    if ran.busy and limit:
        emit(SweepEvent("message", f"cell {pc.cell_id} repeat {repeat} started busy again after {limit} busy "
                                   "re-run(s): its busy runs are kept, and flagged"))


def _ended(pc: PlannedCell, repeat: int, outcome: RunOutcome, run_dir: Path, summary: SweepSummary,
           emit: Callable[[SweepEvent], None]) -> None:
    """Count a recorded run and say how it ended; stop the sweep when it failed on a full disk."""
    summary.count(outcome.status)
    emit(SweepEvent("run-end", cell=pc, repeat=repeat, outcome=outcome))
    if outcome.status != "ok" and _out_of_space(run_dir, outcome):
        raise SweepStopped(MatrunError(
            f"no space left on device: {run_dir} (the run failed and the disk under it is full; every "
            "finished run is kept; free some space and run the sweep again)"), summary)


# -- the drift canary ([sweep] canary, runner/sweep/canary.py) --------------------------------


def _canary_cell(matrix: Matrix, runner: Executor, every_cell: Sequence[PlannedCell],
                 cells: Sequence[PlannedCell]) -> PlannedCell | None:
    """The canary's reference cell (None without ``[sweep] canary``); the slurm executor
    refuses a canary before anything runs."""
    if matrix.sweep.canary is None:
        return None
    if isinstance(runner, AsyncExecutor):
        raise InputError(SLURM_REFUSAL)
    return reference_cell(matrix.sweep.canary, matrix.path, every_cell, cells)


def _run_canary(runner: SyncExecutor, matrix: Matrix, canary: Canary,
                done: dict[tuple[str, int], dict[str, Any]], data_dir: Path, host: dict[str, Any],
                summary: SweepSummary, emit: Callable[[SweepEvent], None], queue: IngestQueue, *,
                watch: LoadWatch | None = None) -> None:
    """One canary run: a new attempt of the reference cell's ``CANARY_REPEAT``, run, recorded,
    ingested and counted like any run.  No claim: no sweep runs that repeat as a repeat, and
    its attempt is chosen under the results directory's lock like every run's."""
    pc, number = canary.cell, canary.next()
    emit(SweepEvent("message", f"canary run {number} of {canary.count}: cell {pc.cell_id} ({pc.cell.label})"))
    emit(SweepEvent("run-start", cell=pc, repeat=CANARY_REPEAT))
    earlier = done.get((pc.cell_id, CANARY_REPEAT), {}).get("max_attempt") or 0
    outcome, run_dir = _run_one(runner, matrix, pc, CANARY_REPEAT, earlier, data_dir, host, summary, queue,
                                canary=number, watch=watch)
    _ended(pc, CANARY_REPEAT, outcome, run_dir, summary, emit)


def _run_one(runner: SyncExecutor, matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int,
             data_dir: Path, host: dict[str, Any], summary: SweepSummary, queue: IngestQueue, *,
             canary: int | None = None, watch: LoadWatch | None = None) -> tuple[RunOutcome, Path]:
    """Run one attempt: its directory, the executor, ``result.json``, the ingest (``queue``).  An
    ``OSError`` (a full disk) is raised after recording what can still be recorded.
    ``canary``: a canary run's number (spec.json ``canary``).  ``watch``: the sweep's look at
    other processes' load, read as the run starts and restarted as it ends."""
    key, run_dir = prepare_run(matrix, pc, repeat, earlier_attempt, data_dir, canary=canary)
    params = pc.params
    request = RunRequest(run_dir=run_dir, params=params, env_id=pc.env_id,
                         timeout=params["timeout"], data_dir=data_dir)
    host = with_state(host, params, watch)  # the machine just before this run: busy? (runner/sweep/machine.py)
    try:
        outcome = runner.run(request)
        if watch is not None:
            watch.restart()  # the next run's window: from here (this run's ingest and files) to its start
    except OSError as exc:  # the executor could not write the cell's files: nothing runs
        error = path_error(exc, run_dir)
        if _record(key, run_dir, pc.env_id, runner.name, host, _failed(f"[matrun] {error}")):
            queue.add(run_dir)  # the sweep stops: flushed on the way out
        raise SweepStopped(error, summary) from None
    except RunAborted as exc:  # the executor cannot go on (the Docker engine is gone): record the run, stop
        if _record(key, run_dir, pc.env_id, runner.name, host, exc.outcome):
            queue.add(run_dir)
        summary.count(exc.outcome.status)
        raise
    except BaseException:
        _record(key, run_dir, pc.env_id, runner.name, host, cancelled_outcome())
        raise
    write_result(key, run_dir, pc.env_id, runner.name, host, outcome,  # an OSError: no result, run again later
                 design=design_record(sweep_design(matrix)))
    queue.add(run_dir)
    return outcome, run_dir


def _cells_cpus(todo: Sequence[tuple[PlannedCell, int]]) -> set[int] | None:
    """The CPUs the cells to run will use: their cpusets' union, None (all) when one has none."""
    cpus: set[int] = set()
    for pc, _ in todo:
        if not pc.params.get("cpuset"):
            return None
        cpus |= set(parse_cpuset(pc.params["cpuset"]))
    return cpus


def _record(key: Any, run_dir: Path, env_id: str, executor: str, host: dict[str, Any],
            outcome: RunOutcome) -> bool:
    """``result.json`` for a run that is ending abnormally, if the disk still takes it (an
    interrupt or a full disk is already on its way up: this never replaces it)."""
    try:
        write_result(key, run_dir, env_id, executor, host, outcome)
    except OSError:
        return False
    return True


def _failed(error: str) -> RunOutcome:
    """A run that failed before its cell started (its files could not be written)."""
    now = datetime.now(timezone.utc).isoformat()
    return RunOutcome(status="failed", exit_code=None, error_tail=error, started_at=now, ended_at=now,
                      wall_seconds=0.0)


def _out_of_space(run_dir: Path, outcome: RunOutcome) -> bool:
    """Whether a run that did not end ok ended so because the disk under it is full."""
    if "No space left on device" in (outcome.error_tail or ""):
        return True
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE_BYTES


def _done_on_disk(matrix: Matrix, pairs: Sequence[tuple[PlannedCell, int]],
                  summary: SweepSummary) -> set[tuple[str, int]]:
    """The (cell, repeat)s of ``pairs`` with an ok run in another sweep's folder of the results
    directory, ingested now (already there: unchanged).  A bundle the warehouse refuses as
    damaged does not count (the pair runs again); when the warehouse refuses the ingest as a
    whole, a bundle that reads whole counts, so nothing runs twice."""
    results = matrix.sweep.results
    found: dict[tuple[str, int], list[Path]] = {}
    for pc, repeat in pairs:
        dirs = [d for d in ok_runs_on_disk(results, pc.cell_id, repeat) if d.parent.parent.name != matrix.sweep.name]
        if dirs:
            found[(pc.cell_id, repeat)] = dirs
    if not found:
        return set()
    paths = [d for dirs in found.values() for d in dirs]
    report = ingest_quietly(paths, matrix.sweep.warehouse, summary)
    if report is not None:
        good = {Path(p).resolve() for p in [*report.ingested, *report.unchanged]}
    else:
        good = {p.resolve() for p in paths if _reads_whole(p)}
    return {pair for pair, dirs in found.items() if any(d.resolve() in good for d in dirs)}


def _reads_whole(run_dir: Path) -> bool:
    try:
        load_bundle(run_dir)
    except MatrunError:
        return False
    return True


#: At most this many refused cells are named in the error; the rest are counted.
MAX_REFUSED_SHOWN = 20


def _runnable(cells: Sequence[PlannedCell], runner: Executor, *,
              skip: bool) -> tuple[list[PlannedCell], list[str]]:
    """The cells the executor can run, and ``cell <id> (<label>): <reason>`` for each it
    refuses (``refusal``), asked before anything runs: refused cells are an ``InputError``
    naming them all, unless ``skip`` (``--skip-unrunnable``) leaves them out; with nothing
    left to run they are an error all the same."""
    runnable: list[PlannedCell] = []
    refused: list[str] = []
    for pc in cells:
        reason = runner.refusal(pc.params)
        if reason:
            refused.append(f"cell {pc.cell_id} ({pc.cell.label}): {reason}")
        else:
            runnable.append(pc)
    if not refused or (skip and runnable):
        return runnable, refused
    lines = refused[:MAX_REFUSED_SHOWN]
    if len(refused) > MAX_REFUSED_SHOWN:
        lines.append(f"… and {len(refused) - MAX_REFUSED_SHOWN:,} more cells refused")
    if runnable:
        lines.append(f"nothing ran: {len(refused):,} of {len(cells):,} cells cannot run here; --skip-unrunnable "
                     f"skips them and runs the other {len(runnable):,}")
    elif skip:
        lines.append("--skip-unrunnable: no cell of the selection is left to run")
    elif len(refused) > 1:
        lines.append(f"nothing ran: none of the {len(cells):,} cells can run here")
    raise InputError("\n".join(lines))


def _check_refusals(cells: Sequence[PlannedCell], runner: Executor) -> None:
    """Refuse, before anything runs, cells the executor says it cannot run (``refusal``)."""
    for pc in cells:
        reason = runner.refusal(pc.params)
        if reason:
            raise InputError(f"cell {pc.cell_id} ({pc.cell.label}): {reason}")


def _check_enforced(cells: Sequence[PlannedCell], runner: Executor) -> None:
    """Refuse, before anything runs, cells asking for a limit this executor cannot enforce."""
    for pc in cells:
        if pc.params.get("memory_limit") and "memory_limit" not in runner.enforces:
            raise InputError(f"cell {pc.cell_id} sets memory_limit, which the {runner.name} executor cannot "
                             f"enforce; run it with --executor docker")


def _catch_up(sweep_dir: Path, matrix: Matrix, summary: SweepSummary,
              emit: Callable[[SweepEvent], None]) -> None:
    """Ingest bundles already on disk (a previous sweep may have died before ingesting)."""
    if not any(entry.name != ".sweep.lock" for entry in sweep_dir.iterdir()):
        return
    report = ingest([sweep_dir], warehouse=matrix.sweep.warehouse, wait_s=INGEST_WAIT_S)
    summary.add_ingest(report)
    if report.ingested:
        emit(SweepEvent("message", f"caught up: ingested {len(report.ingested)} earlier runs from {sweep_dir}"))
    if report.skipped:  # listed with the sweep's summary
        emit(SweepEvent("message", f"warning: {len(report.skipped)} earlier bundles in {sweep_dir} were skipped"))


def _expected(todo: list[tuple[PlannedCell, int]], known: dict[str, float]) -> dict[str, float]:
    """Cell id -> the seconds a run of it should take: the median wall time of its earlier ok
    runs, a cell that never ran the mean of the others; {} when none of them ran."""
    seen = [known[pc.cell_id] for pc, _ in todo if pc.cell_id in known]
    if not seen:
        return {}
    mean = sum(seen) / len(seen)
    return {pc.cell_id: known.get(pc.cell_id, mean) for pc, _ in todo}
