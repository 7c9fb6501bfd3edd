"""What both sweep loops share: a run's directory and records, ingesting, the lock, the events.

The synchronous loop (``runner/sweep/run.py``) and the asynchronous one
(``runner/slurm/loop.py``) each prepare a run's new attempt directory with its ``spec.json``
(``prepare_run``), have its ``result.json`` written last and atomically (``write_result``: by the
sweep, by a Slurm task, or for a run Slurm ended), ingest what finished without failing the
sweep when the warehouse cannot take it (``ingest_quietly``), hold the sweep's lock
(``sweep_lock``) and report to the caller through ``SweepEvent`` and ``SweepSummary``.
"""

from __future__ import annotations

import fcntl
import os
import platform
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psutil

import matrun
from matrun.errors import MatrunError, SweepLocked
from matrun.runner.executors.protocol import RunOutcome
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.planning.matrix import Matrix
from matrun.warehouse.bundles.layout import RESULT, SCHEMA_VERSION, SPEC, RunKey
from matrun.warehouse.bundles.write import next_attempt, write_json_atomic

INGEST_WAIT_S = 60.0  # how long an ingest waits for the warehouse's lock


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

    def count(self, status: str) -> None:
        """One more run that ended with ``status``."""
        self.ran += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1


def prepare_run(matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int,
                data_dir: Path) -> tuple[RunKey, Path]:
    """The run's new attempt directory with its spec.json.  Attempts count across sweeps:
    ``earlier_attempt`` is the highest the warehouse knows of (another sweep's folder too)."""
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


def write_result(key: RunKey, run_dir: Path, env_id: str, executor: str,
                 host: dict[str, Any] | None, outcome: RunOutcome) -> None:
    """``result.json``, last and atomically (also written by Slurm tasks and for runs Slurm ended)."""
    write_json_atomic(run_dir / RESULT, {
        "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
        "repeat": key.repeat, "attempt": key.attempt, "env_id": env_id, "executor": executor,
        "status": outcome.status, "exit_code": outcome.exit_code, "error_tail": outcome.error_tail,
        "started_at": outcome.started_at, "ended_at": outcome.ended_at,
        "wall_seconds": outcome.wall_seconds, "host": host, "monitor": outcome.monitor,
        # The image the cell ran in (docker runtime): tag, ID, repo digests, content hash.
        "image": outcome.image or None,
    })


def ingest_quietly(paths: list[Path], warehouse: Path, summary: SweepSummary) -> None:
    """Ingest finished runs; what the warehouse did not take goes to ``summary.not_ingested``
    (the bundles are safe on disk: ``matrun ingest`` loads them later)."""
    # Imported here: duckdb and pyarrow are heavy, and Slurm tasks import this module (for
    # write_result and host_info) on every node without ever ingesting.
    from matrun.warehouse.ingest import ingest

    try:
        report = ingest(paths, warehouse=warehouse, wait_s=INGEST_WAIT_S)
    except MatrunError as exc:  # the bundle is safe on disk; say how to load it later
        summary.not_ingested.append(f"{paths[0]}: {exc}")
        return
    for path, reason in report.skipped:
        summary.not_ingested.append(f"{path}: {reason}")


@contextmanager
def sweep_lock(sweep_dir: Path, name: str) -> Iterator[None]:
    """One ``matrun sweep`` (or ``matrun cancel``'s recording) of a sweep at a time:
    ``SweepLocked`` names the process that holds it."""
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
