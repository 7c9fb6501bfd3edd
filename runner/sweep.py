"""Running a sweep: what is not done yet, each run ingested as it finishes.

Resumability comes from the bundles on disk: before running, the sweep ingests whatever
bundles its results directory already holds, so a warehouse that was deleted or missed an
ingest is caught up; then every (cell, repeat) without an ok run is run as a new attempt.
A run's bundle is complete (``result.json`` written) before it is ingested, so a failure of
the warehouse loses nothing: ``matrun ingest`` picks the bundle up later.

Local and docker executors run one cell at a time here.  An *asynchronous* executor (slurm)
gets every run at once: the sweep writes each run's directory and ``spec.json``, the executor
submits them (``runner/slurm/executor.py``), and the sweep then polls — ingesting each run
as its ``result.json`` appears — until none is queued or running (or returns at once with
``detach``).  Runs already queued or running from an earlier (detached) sweep are waited for,
never submitted again.  Ctrl-C / SIGTERM cancels the sweep's jobs (``scancel``), waits until
their tasks have stopped their containers, records what ran as cancelled and re-raises.
"""

from __future__ import annotations

import fcntl
import os
import platform
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import psutil

import matrun
from matrun.errors import InputError, MatrunError, SweepLocked
from matrun.warehouse.bundles.write import RESULT, SCHEMA_VERSION, SPEC, RunKey, next_attempt, write_json_atomic
from matrun.runner.executors.protocol import RunOutcome, RunRequest
from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.matrix import Matrix, load_matrix
from matrun.runner.planning.identity import (
    PlannedCell, done_runs, durations, parse_where, plan_cells, preflight, preflight_data, resolve_data_dir,
    select,
)

INGEST_WAIT_S = 60.0
FILE_POLL_S = 0.5  # async sweeps: how often run directories are looked at for a new result.json
CANCEL_WAIT_S = 180.0  # async sweeps: how long to wait for cancelled tasks to stop their containers


@dataclass
class SweepEvent:
    kind: str  # "message" | "plan" | "run-start" | "run-end"
    text: str = ""
    total: int = 0
    estimate_s: float | None = None
    cell: PlannedCell | None = None
    repeat: int = 0
    outcome: RunOutcome | None = None


@dataclass
class SweepSummary:
    sweep: str
    executor: str
    planned: int = 0
    skipped_done: int = 0
    ran: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    not_ingested: list[str] = field(default_factory=list)
    # asynchronous executors (slurm)
    submitted: int = 0
    job_ids: list[str] = field(default_factory=list)
    in_flight: int = 0  # runs queued or running from earlier submissions when this sweep started
    detached: bool = False
    warnings: list[str] = field(default_factory=list)


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
    asynchronous = getattr(runner, "asynchronous", False)
    if asynchronous:  # cpusets and GPUs are the nodes', not this host's: only the data is checked here
        preflight_data(cells, data_dir)
    else:
        preflight(cells, data_dir)
    _check_enforced(cells, runner)
    _check_refusals(cells, runner)
    summary = SweepSummary(sweep=matrix.sweep.name, executor=runner.name)
    results = matrix.sweep.results
    sweep_dir = results / matrix.sweep.name
    sweep_dir.mkdir(parents=True, exist_ok=True)

    with _sweep_lock(sweep_dir, matrix.sweep.name):
        jobs = None
        in_flight: set[tuple[str, int]] = set()
        if asynchronous:  # what earlier submissions are still doing; results Slurm decided are written
            jobs = runner.jobs(sweep_dir)
            views = jobs.refresh()
            in_flight = {(v.entry.cell_id, v.entry.repeat) for v in views if v.in_flight}
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
        if asynchronous:
            return _run_async(runner, jobs, matrix, todo, done, data_dir, summary, emit, detach=detach)
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
            summary.ran += 1
            summary.by_status[outcome.status] = summary.by_status.get(outcome.status, 0) + 1
            emit(SweepEvent("run-end", cell=pc, repeat=repeat, outcome=outcome))
    return summary


def _prepare_run(matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int,
                 data_dir: Path) -> tuple[RunKey, Path]:
    """The run's new attempt directory with its spec.json."""
    results = matrix.sweep.results
    attempt = max(next_attempt(results, matrix.sweep.name, pc.cell_id, repeat), earlier_attempt + 1)
    key = RunKey(matrix.sweep.name, pc.cell_id, repeat, attempt)
    run_dir = key.directory(results)
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / SPEC, {
        "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
        "repeat": key.repeat, "attempt": key.attempt, "env_id": pc.env_id,
        "data_dir": str(data_dir), "params": pc.params,
    })
    return key, run_dir


def _run_one(runner, matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int, data_dir: Path,
             host: dict[str, Any], summary: SweepSummary) -> RunOutcome:
    key, run_dir = _prepare_run(matrix, pc, repeat, earlier_attempt, data_dir)
    params = pc.params
    request = RunRequest(run_dir=run_dir, params=params, env_id=pc.env_id,
                         timeout=params["timeout"], data_dir=data_dir)
    try:
        outcome = runner.run(request)
    except BaseException:
        write_result(key, run_dir, pc.env_id, runner.name, host, _cancelled())
        raise
    write_result(key, run_dir, pc.env_id, runner.name, host, outcome)
    _ingest_quietly([run_dir], matrix.sweep.warehouse, summary)
    return outcome


def _run_async(runner, jobs, matrix: Matrix, todo: list[tuple[PlannedCell, int]],
               done: dict[tuple[str, int], dict[str, Any]], data_dir: Path, summary: SweepSummary,
               emit: Callable[[SweepEvent], None], *, detach: bool) -> SweepSummary:
    """Submit ``todo`` through an asynchronous executor, then (unless ``detach``) ingest every run
    of the sweep's submissions as it finishes until none is queued or running."""
    from matrun.runner.slurm.executor import PreparedRun

    sweep_dir = matrix.sweep.results / matrix.sweep.name
    cells = {pc.cell_id: pc for pc, _ in todo}
    reported: set[Path] = set()
    try:
        if todo:
            runner.prepare({(pc.params["framework"], pc.params["variant"]) for pc, _ in todo},
                           log=lambda text: emit(SweepEvent("message", text)))
            runs = []
            for pc, repeat in todo:
                earlier = done.get((pc.cell_id, repeat), {}).get("max_attempt") or 0
                key, run_dir = _prepare_run(matrix, pc, repeat, earlier, data_dir)
                runs.append(PreparedRun(key, run_dir, pc.params))
            submitted = runner.submit(sweep_dir, matrix.sweep.name, runs, on_submitted=jobs.add,
                                      log=lambda text: emit(SweepEvent("message", text)))
            summary.submitted = len(runs)
            summary.job_ids = [s.job_id for s in submitted]
        if detach:
            summary.detached = True
            return summary
        views = jobs.refresh(max_age=0)
        reported = {v.run_dir for v in views if v.phase in ("finished", "dropped")}
        announced: set[Path] = set()
        poll = runner.settings.poll_interval
        while True:
            fresh = [v for v in views if v.phase in ("finished", "dropped") and v.run_dir not in reported]
            finished = [v for v in fresh if v.phase == "finished"]
            if finished:
                _ingest_quietly([v.run_dir for v in finished], matrix.sweep.warehouse, summary)
            for v in fresh:
                reported.add(v.run_dir)
                if v.phase == "finished":
                    _report_finished(v, cells, summary, emit)
            for v in views:
                if v.phase == "running" and v.run_dir not in announced:
                    announced.add(v.run_dir)
                    emit(SweepEvent("run-start", cell=_cell_of(v, cells), repeat=v.entry.repeat))
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
        finished = [v.run_dir for v in views if v.phase == "finished" and v.run_dir not in reported]
        if finished:
            _ingest_quietly(finished, matrix.sweep.warehouse, summary)
        note = "" if ended else f"; some tasks were still ending after {CANCEL_WAIT_S:.0f} s (see squeue)"
        emit(SweepEvent("message", f"cancelled job(s) {', '.join(cancelled) or 'none'}{note}"))
        raise
    summary.warnings.extend(w for w in jobs.warnings if w not in summary.warnings)
    return summary


def _report_finished(view, cells: dict[str, PlannedCell], summary: SweepSummary,
                     emit: Callable[[SweepEvent], None]) -> None:
    import json

    try:
        result = json.loads((view.run_dir / RESULT).read_text())
    except (OSError, ValueError):
        return
    outcome = RunOutcome(status=result["status"], exit_code=result.get("exit_code"),
                         error_tail=result.get("error_tail") or "", started_at=result.get("started_at") or "",
                         ended_at=result.get("ended_at") or "", wall_seconds=float(result.get("wall_seconds") or 0))
    summary.ran += 1
    summary.by_status[outcome.status] = summary.by_status.get(outcome.status, 0) + 1
    emit(SweepEvent("run-end", cell=_cell_of(view, cells), repeat=view.entry.repeat, outcome=outcome))


def _cell_of(view, cells: dict[str, PlannedCell]) -> PlannedCell:
    """The planned cell of a recorded task; one submitted by an earlier sweep (not in this
    selection) is described by its id."""
    pc = cells.get(view.entry.cell_id)
    return pc if pc is not None else PlannedCell(_Unnamed(view.entry.cell_id), view.entry.cell_id, "")


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
                 on_message: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """``matrun cancel``: scancel the sweep's recorded Slurm jobs, wait until their tasks have
    stopped their containers, record what ran as cancelled and ingest it (unless a running
    ``matrun sweep`` holds the sweep: it does that itself)."""
    from matrun.runner.slurm.executor import SweepJobs

    matrix = load_matrix(matrix_path)
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
        with _sweep_lock(sweep_dir, matrix.sweep.name):
            views = jobs.refresh(max_age=0)
            recorded = [v.run_dir for v in views if v.phase == "finished" and v.status == "cancelled"]
            outcome["recorded"] = len(recorded)
            if any(v.phase == "finished" for v in views):
                from matrun.warehouse.ingest import ingest

                ingest([sweep_dir], warehouse=matrix.sweep.warehouse, wait_s=INGEST_WAIT_S)
    except SweepLocked:
        views = jobs.refresh(max_age=0, record=False)
        on_message("a matrun sweep of this sweep is waiting on the jobs: it records and ingests the cancelled runs")
    outcome["left"] = sum(1 for v in views if v.phase in ("queued", "running"))
    return outcome


def _cancelled() -> RunOutcome:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).isoformat()
    return RunOutcome(status="cancelled", exit_code=None, error_tail="[matrun] the sweep was interrupted",
                      started_at=now, ended_at=now, wall_seconds=0.0)


def write_result(key: RunKey, run_dir: Path, env_id: str, executor: str,
                 host: dict[str, Any] | None, outcome: RunOutcome) -> None:
    """``result.json``, last and atomically (also written by Slurm tasks and for runs Slurm ended)."""
    write_json_atomic(run_dir / RESULT, {
        "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
        "repeat": key.repeat, "attempt": key.attempt, "env_id": env_id, "executor": executor,
        "status": outcome.status, "exit_code": outcome.exit_code, "error_tail": outcome.error_tail,
        "started_at": outcome.started_at, "ended_at": outcome.ended_at,
        "wall_seconds": outcome.wall_seconds, "host": host, "monitor": outcome.monitor,
        # The image the cell ran in (docker executor): tag, ID, repo digests, content hash.
        "image": getattr(outcome, "image", None) or None,
    })


def _check_refusals(cells: Sequence[PlannedCell], runner) -> None:
    """Refuse, before anything runs, cells the executor says it cannot run (``refusal``)."""
    refusal = getattr(runner, "refusal", None)
    if refusal is None:
        return
    for pc in cells:
        reason = refusal(pc.params)
        if reason:
            raise InputError(f"cell {pc.cell_id} ({pc.cell.label}): {reason}")


def _check_enforced(cells: Sequence[PlannedCell], runner) -> None:
    """Refuse, before anything runs, cells asking for a limit this executor cannot enforce."""
    enforced = getattr(runner, "enforces", frozenset())
    for pc in cells:
        if pc.params.get("memory_limit") and "memory_limit" not in enforced:
            raise InputError(f"cell {pc.cell_id} sets memory_limit, which the {runner.name} executor cannot "
                             f"enforce; run it with --executor docker")


def _catch_up(sweep_dir: Path, matrix: Matrix, emit) -> None:
    """Ingest bundles already on disk (a previous sweep may have died before ingesting)."""
    if not any(sweep_dir.iterdir()):
        return
    from matrun.warehouse.ingest import ingest

    report = ingest([sweep_dir], warehouse=matrix.sweep.warehouse, wait_s=INGEST_WAIT_S)
    if report.ingested:
        emit(SweepEvent("message", f"caught up: ingested {len(report.ingested)} earlier runs from {sweep_dir}"))
    for path, reason in report.skipped:
        emit(SweepEvent("message", f"warning: skipped bundle {path}: {reason}"))


def _ingest_quietly(paths: list[Path], warehouse: Path, summary: SweepSummary) -> None:
    from matrun.warehouse.ingest import ingest

    try:
        report = ingest(paths, warehouse=warehouse, wait_s=INGEST_WAIT_S)
    except MatrunError as exc:  # the bundle is safe on disk; say how to load it later
        summary.not_ingested.append(f"{paths[0]}: {exc}")
        return
    for path, reason in report.skipped:
        summary.not_ingested.append(f"{path}: {reason}")


def _estimate(todo: list[tuple[PlannedCell, int]], known: dict[str, float]) -> float | None:
    seen = [known[pc.cell_id] for pc, _ in todo if pc.cell_id in known]
    if not seen:
        return None
    mean = sum(seen) / len(seen)
    return sum(known.get(pc.cell_id, mean) for pc, _ in todo)


@contextmanager
def _sweep_lock(sweep_dir: Path, name: str) -> Iterator[None]:
    path = sweep_dir / ".sweep.lock"
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise SweepLocked(f"sweep {name!r} is already running in {holder} "
                              f"(lock {path}); wait for it or stop it first") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        try:
            yield
        finally:
            fh.truncate(0)


def host_info() -> dict[str, Any]:
    """What the host is, for provenance.  Fails soft: unknown fields are None."""
    cpu_model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "matrun_version": matrun.__version__,
    }
