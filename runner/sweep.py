"""Running a sweep: what is not done yet, one run at a time, each ingested as it finishes.

Resumability comes from the bundles on disk: before running, the sweep ingests whatever
bundles its results directory already holds, so a warehouse that was deleted or missed an
ingest is caught up; then every (cell, repeat) without an ok run is run as a new attempt.
A run's bundle is complete (``result.json`` written) before it is ingested, so a failure of
the warehouse loses nothing: ``matrun ingest`` picks the bundle up later.
"""

from __future__ import annotations

import fcntl
import os
import platform
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import psutil

import matrun
from matrun.errors import InputError, MatrunError, SweepLocked
from matrun.runner.bundle import RESULT, SCHEMA_VERSION, SPEC, RunKey, next_attempt, write_json_atomic
from matrun.runner.executors import RunOutcome, RunRequest, get_executor
from matrun.runner.matrix import Matrix, load_matrix
from matrun.runner.plan import (
    PlannedCell, done_runs, durations, parse_where, plan_cells, preflight, resolve_data_dir, select,
)

INGEST_WAIT_S = 60.0


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


def run_sweep(*, matrix_path: Path, where: Sequence[str] = (), force: bool = False,
              executor: str | None = None, on_event: Callable[[SweepEvent], None] | None = None) -> SweepSummary:
    emit = on_event or (lambda event: None)
    matrix = load_matrix(matrix_path)
    filters = parse_where(where)
    runner, picked = get_executor(executor or matrix.sweep.executor)
    emit(SweepEvent("message", picked))
    cells = select(plan_cells(matrix, runner.env_id), filters)
    data_dir = resolve_data_dir(matrix)
    preflight(cells, data_dir)
    _check_enforced(cells, runner)
    summary = SweepSummary(sweep=matrix.sweep.name, executor=runner.name)
    results = matrix.sweep.results
    sweep_dir = results / matrix.sweep.name
    sweep_dir.mkdir(parents=True, exist_ok=True)

    with _sweep_lock(sweep_dir, matrix.sweep.name):
        _catch_up(sweep_dir, matrix, emit)
        done = done_runs(matrix.sweep.warehouse)
        todo = [(pc, r) for r in range(matrix.sweep.repeats) for pc in cells
                if force or not done.get((pc.cell_id, r), {}).get("ok")]
        summary.planned = len(cells) * matrix.sweep.repeats
        summary.skipped_done = summary.planned - len(todo)
        known = durations(matrix.sweep.warehouse)
        estimate = _estimate(todo, known)
        emit(SweepEvent("plan", f"{len(todo)} runs to do, {summary.skipped_done} already done",
                        total=len(todo), estimate_s=estimate))
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


def _run_one(runner, matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int, data_dir: Path,
             host: dict[str, Any], summary: SweepSummary) -> RunOutcome:
    results = matrix.sweep.results
    attempt = max(next_attempt(results, matrix.sweep.name, pc.cell_id, repeat), earlier_attempt + 1)
    key = RunKey(matrix.sweep.name, pc.cell_id, repeat, attempt)
    run_dir = key.directory(results)
    run_dir.mkdir(parents=True)
    params = pc.params
    write_json_atomic(run_dir / SPEC, {
        "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
        "repeat": key.repeat, "attempt": key.attempt, "env_id": pc.env_id,
        "data_dir": str(data_dir), "params": params,
    })
    request = RunRequest(run_dir=run_dir, params=params, env_id=pc.env_id,
                         timeout=params["timeout"], data_dir=data_dir)
    try:
        outcome = runner.run(request)
    except BaseException:
        _write_result(key, run_dir, pc, runner.name, host, _cancelled())
        raise
    _write_result(key, run_dir, pc, runner.name, host, outcome)
    _ingest_quietly([run_dir], matrix.sweep.warehouse, summary)
    return outcome


def _cancelled() -> RunOutcome:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).isoformat()
    return RunOutcome(status="cancelled", exit_code=None, error_tail="[matrun] the sweep was interrupted",
                      started_at=now, ended_at=now, wall_seconds=0.0)


def _write_result(key: RunKey, run_dir: Path, pc: PlannedCell, executor: str,
                  host: dict[str, Any], outcome: RunOutcome) -> None:
    write_json_atomic(run_dir / RESULT, {
        "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
        "repeat": key.repeat, "attempt": key.attempt, "env_id": pc.env_id, "executor": executor,
        "status": outcome.status, "exit_code": outcome.exit_code, "error_tail": outcome.error_tail,
        "started_at": outcome.started_at, "ended_at": outcome.ended_at,
        "wall_seconds": outcome.wall_seconds, "host": host, "monitor": outcome.monitor,
        # The image the cell ran in (docker executor): tag, ID, repo digests, content hash.
        "image": getattr(outcome, "image", None) or None,
    })


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
