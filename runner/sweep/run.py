"""Running a sweep: what is not done yet, each run ingested as it finishes.

Resumability comes from the bundles on disk: before running, the sweep ingests whatever
bundles its results directory already holds, so a warehouse that was deleted or missed an
ingest is caught up; then every (cell, repeat) without an ok run is run as a new attempt.
A run's bundle is complete (``result.json`` written) before it is ingested, so a failure of
the warehouse loses nothing: ``matrun ingest`` picks the bundle up later.

The loop follows the executor's kind (``runner/executors/protocol.py``).  A ``SyncExecutor``
(local, docker) runs one cell at a time here.  An ``AsyncExecutor`` (slurm) gets every run at
once and is waited on by the asynchronous loop, ``runner/slurm/loop.py``; runs already queued or
running from an earlier (detached) sweep are waited for, never submitted again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from matrun.errors import InputError
from matrun.runner.executors.outcomes import cancelled_outcome
from matrun.runner.executors.protocol import AsyncExecutor, Executor, RunOutcome, RunRequest, SyncExecutor
from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.history import done_runs, durations
from matrun.runner.planning.identity import PlannedCell, plan_cells
from matrun.runner.planning.preflight import preflight, preflight_data, resolve_data_dir
from matrun.runner.planning.selection import parse_where, select
from matrun.runner.planning.matrix import Matrix, load_matrix
from matrun.runner.slurm.loop import run_async
from matrun.runner.sweep.records import (
    INGEST_WAIT_S, SweepEvent, SweepSummary, host_info, ingest_quietly, prepare_run, sweep_lock, write_result,
)
from matrun.warehouse.ingest import ingest


def run_sweep(*, matrix_path: Path, where: Sequence[str] = (), force: bool = False,
              executor: str | None = None, on_event: Callable[[SweepEvent], None] | None = None,
              detach: bool = False, slurm: Mapping[str, Any] | None = None) -> SweepSummary:
    """Run (or, for slurm, submit) every selected (cell, repeat) without an ok run.

    ``slurm``: overrides of the matrix's ``[slurm]`` settings (``SlurmSettings`` field names;
    ``None`` values are ignored).  ``detach``: slurm only, return once submitted.
    """
    emit = on_event or (lambda event: None)
    matrix = load_matrix(matrix_path)
    filters = parse_where(where)
    name = executor or matrix.sweep.executor
    overrides = {k: v for k, v in (slurm or {}).items() if v is not None and v != () and v != []}
    if name != "slurm" and (overrides or detach):
        flags = ", ".join(["--detach"] * detach + [f"--{k.replace('_', '-')}" for k in overrides])
        raise InputError(f"{flags}: only for --executor slurm (this sweep's executor is {name})")
    settings = matrix.slurm.merged(overrides) if name == "slurm" else None
    runner, picked = get_executor(name, slurm=settings)
    emit(SweepEvent("message", picked))
    cells = select(plan_cells(matrix, runner.env_id), filters)
    data_dir = resolve_data_dir(matrix)
    if isinstance(runner, AsyncExecutor):  # cpusets and GPUs are the nodes', not this host's
        preflight_data(cells, data_dir)
    else:
        preflight(cells, data_dir)
    _check_enforced(cells, runner)
    _check_refusals(cells, runner)
    summary = SweepSummary(sweep=matrix.sweep.name, executor=runner.name)
    results = matrix.sweep.results
    sweep_dir = results / matrix.sweep.name
    sweep_dir.mkdir(parents=True, exist_ok=True)

    with sweep_lock(sweep_dir, matrix.sweep.name):
        jobs = None
        in_flight: set[tuple[str, int]] = set()
        if isinstance(runner, AsyncExecutor):  # what earlier submissions still do; results Slurm decided are written
            jobs = runner.jobs(sweep_dir)
            in_flight = {(v.cell_id, v.repeat) for v in jobs.refresh() if v.in_flight}
            summary.warnings.extend(jobs.warnings)
        _catch_up(sweep_dir, matrix, emit)
        done = done_runs(matrix.sweep.warehouse)
        todo = [(pc, r) for r in range(matrix.sweep.repeats) for pc in cells
                if (force or not done.get((pc.cell_id, r), {}).get("ok")) and (pc.cell_id, r) not in in_flight]
        summary.planned = len(cells) * matrix.sweep.repeats
        selected = {(pc.cell_id, r) for pc in cells for r in range(matrix.sweep.repeats)}
        summary.in_flight = len(in_flight)  # all of them are waited for, selected by --where or not
        summary.skipped_done = summary.planned - len(todo) - len(in_flight & selected)
        known = durations(matrix.sweep.warehouse)
        estimate = _estimate(todo, known)
        waiting = f", {summary.in_flight} already queued or running in Slurm" if summary.in_flight else ""
        emit(SweepEvent("plan", f"{len(todo)} runs to do, {summary.skipped_done} already done{waiting}",
                        total=len(todo) + (0 if detach else summary.in_flight), estimate_s=estimate))
        if isinstance(runner, AsyncExecutor):
            return run_async(runner, jobs, matrix, todo, done, data_dir, summary, emit, detach=detach)
        if not todo:
            return summary
        runner.prepare({(pc.params["framework"], pc.params["variant"]) for pc, _ in todo},
                       log=lambda text: emit(SweepEvent("message", text)))
        host = host_info()
        for pc, repeat in todo:
            emit(SweepEvent("run-start", cell=pc, repeat=repeat))
            # Attempts count across sweeps: the same cell may have run in another sweep's folder.
            earlier = done.get((pc.cell_id, repeat), {}).get("max_attempt") or 0
            outcome = _run_one(runner, matrix, pc, repeat, earlier, data_dir, host, summary)
            summary.count(outcome.status)
            emit(SweepEvent("run-end", cell=pc, repeat=repeat, outcome=outcome))
    return summary


def _run_one(runner: SyncExecutor, matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int,
             data_dir: Path, host: dict[str, Any], summary: SweepSummary) -> RunOutcome:
    key, run_dir = prepare_run(matrix, pc, repeat, earlier_attempt, data_dir)
    params = pc.params
    request = RunRequest(run_dir=run_dir, params=params, env_id=pc.env_id,
                         timeout=params["timeout"], data_dir=data_dir)
    try:
        outcome = runner.run(request)
    except BaseException:
        write_result(key, run_dir, pc.env_id, runner.name, host, cancelled_outcome())
        raise
    write_result(key, run_dir, pc.env_id, runner.name, host, outcome)
    ingest_quietly([run_dir], matrix.sweep.warehouse, summary)
    return outcome


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


def _catch_up(sweep_dir: Path, matrix: Matrix, emit: Callable[[SweepEvent], None]) -> None:
    """Ingest bundles already on disk (a previous sweep may have died before ingesting)."""
    if not any(sweep_dir.iterdir()):
        return
    report = ingest([sweep_dir], warehouse=matrix.sweep.warehouse, wait_s=INGEST_WAIT_S)
    if report.ingested:
        emit(SweepEvent("message", f"caught up: ingested {len(report.ingested)} earlier runs from {sweep_dir}"))
    for path, reason in report.skipped:
        emit(SweepEvent("message", f"warning: skipped bundle {path}: {reason}"))


def _estimate(todo: list[tuple[PlannedCell, int]], known: dict[str, float]) -> float | None:
    seen = [known[pc.cell_id] for pc, _ in todo if pc.cell_id in known]
    if not seen:
        return None
    mean = sum(seen) / len(seen)
    return sum(known.get(pc.cell_id, mean) for pc, _ in todo)
