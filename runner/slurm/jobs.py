"""What a sweep submitted to Slurm, and what became of it.

Each submission (one job array) has a directory ``<results>/<sweep>/.slurm/<id>/`` with
``tasks.json`` (array index → run directory), ``task.sh``, ``job.json`` (the job id, the
cluster, the sbatch arguments) and the tasks' Slurm logs ``task-<index>.log``; a task records
itself in its run directory (``slurm.json``) when it starts.  ``load_submissions`` reads them.

**State** (``SweepJobs.refresh``).  ``squeue --json -t all`` while Slurm lists the job, then the
``jobcomp/filetxt`` log, then ``sacct`` where there is accounting (``runner/slurm/state.py``).  A
task Slurm ended without a ``result.json`` gets one written from Slurm's state
(``write_result_from_slurm``: TIMEOUT → timeout, OUT_OF_MEMORY → oom, CANCELLED → cancelled,
NODE_FAIL / FAILED / anything else → failed, with Slurm's exit code and the end of the task's
log), so every run that started lands in the warehouse; a task cancelled before it started
leaves nothing (its run directory is removed).

Outside a sweep: ``reconcile`` (``matrun ingest``) writes those results for every sweep under
some paths, ``cell_progress`` (``matrun status``) counts the tasks of each cell, writing nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Sequence

from matrun.runner.executors.docker import CONTAINER_JSON
from matrun.runner.executors.protocol import RunOutcome
from matrun.runner.executors.workers import NODES_DIR
from matrun.runner.slurm.settings import SlurmSettings
from matrun.runner.slurm.state import (
    RUN_STATUS, SlurmUnavailable, TaskState, cluster_config, query_states, scancel,
)
from matrun.runner.sweep.records import write_result
from matrun.warehouse.bundles.layout import RESULT, SPEC, STDERR, RunKey
from matrun.warehouse.bundles.write import ERROR_TAIL_BYTES, tail_text, write_json_atomic
from matrun.warehouse.bundles.read import loads

JOBS_DIR = ".slurm"  # <results>/<sweep>/.slurm/<submission>/
TASKS = "tasks.json"
JOB = "job.json"
SCRIPT = "task.sh"
TASK_RECORD = "slurm.json"  # in a run directory: written by the task when it starts
_SUBMISSION = re.compile(r"^[0-9T]+-[0-9]+-[0-9]+\Z")


@dataclass(frozen=True)
class TaskEntry:
    index: int
    run_dir: Path
    cell_id: str
    repeat: int
    attempt: int


@dataclass
class Submission:
    directory: Path
    job_id: str
    cluster: str
    job_name: str
    submitted_at: float
    tasks: list[TaskEntry]
    finalized: bool = False
    grace: float | None = None  # the [slurm] grace the sweep that submitted it had
    uid: int | None = None  # who submitted it

    def log(self, index: int) -> Path:
        return self.directory / f"task-{index}.log"


@dataclass
class TaskView:
    """One task of a recorded submission, as of the last refresh."""

    submission: Submission
    entry: TaskEntry
    phase: str  # queued | running | ending | finished | dropped | unknown
    state: TaskState | None = None
    status: str | None = None  # result.json's status, once finished

    @property
    def run_dir(self) -> Path:
        return self.entry.run_dir

    @property
    def cell_id(self) -> str:
        return self.entry.cell_id

    @property
    def repeat(self) -> int:
        return self.entry.repeat

    @property
    def in_flight(self) -> bool:
        """Still Slurm's (or not yet decided): the sweep must not submit this run again."""
        return self.phase in ("queued", "running", "ending", "unknown")


def load_submissions(sweep_dir: Path, *, include_finalized: bool = False) -> list[Submission]:
    """The submissions recorded under ``<sweep_dir>/.slurm`` (those whose sbatch succeeded)."""
    root = sweep_dir / JOBS_DIR
    found: list[Submission] = []
    if not root.is_dir():
        return found
    for directory in sorted(root.iterdir()):
        if not _SUBMISSION.match(directory.name):
            continue
        try:
            job = json.loads((directory / JOB).read_text())
            tasks = json.loads((directory / TASKS).read_text())
        except (OSError, ValueError):
            continue  # sbatch failed or is running now: nothing was recorded
        if job.get("finalized") and not include_finalized:
            continue
        entries = [TaskEntry(int(t["index"]), Path(t["run_dir"]), str(t["cell_id"]), int(t["repeat"]),
                             int(t["attempt"])) for t in tasks.get("tasks", [])]
        found.append(Submission(directory, str(job["job_id"]), str(job.get("cluster") or ""),
                                str(tasks.get("job_name") or job.get("job_name") or ""),
                                float(job.get("submitted_at") or 0), entries, bool(job.get("finalized")),
                                float(job["grace"]) if isinstance(job.get("grace"), (int, float)) else None,
                                job["uid"] if isinstance(job.get("uid"), int) else None))
    return found


class SweepJobs:
    """The job arrays recorded under one sweep directory, and what Slurm says about them."""

    def __init__(self, sweep_dir: Path, settings: SlurmSettings | None = None, *,
                 include_finalized: bool = False, query: Callable[..., dict] = query_states,
                 config: dict[str, str] | None = None) -> None:
        """``query`` (``runner/slurm/state.py: query_states``) and ``config`` (``scontrol show config``,
        read when first needed) can be given, e.g. by tests."""
        self.sweep_dir = sweep_dir
        self.settings = settings or SlurmSettings()
        self.submissions = load_submissions(sweep_dir, include_finalized=include_finalized)
        self._query = query
        self._config: dict[str, str] | None = config
        self._states: dict[tuple[str, int], TaskState] = {}
        self._queried_at = -math.inf
        self._first_ended: dict[Path, float] = {}
        self._status: dict[Path, str] = {}
        self._known: dict[str, bool] = {}
        self.warnings: list[str] = []

    @property
    def config(self) -> dict[str, str]:
        if self._config is None:
            self._config = cluster_config()
        return self._config

    def add(self, submission: Submission) -> None:
        self.submissions.append(submission)
        self._queried_at = -math.inf

    def _ours(self, sub: Submission) -> bool:
        """Whether this user on this cluster submitted it (else its tasks' state is unknown here:
        Slurm may hide other users' jobs, and another cluster has other job ids)."""
        if sub.job_id not in self._known:
            cluster = self.config.get("ClusterName", "")
            if sub.uid is not None and sub.uid != os.getuid():
                note = f"job {sub.job_id} of {self.sweep_dir.name} was submitted by uid {sub.uid}, not by this user"
            elif sub.cluster and cluster and sub.cluster != cluster:
                note = (f"job {sub.job_id} of {self.sweep_dir.name} was submitted to cluster {sub.cluster!r}, "
                        f"this is {cluster!r}")
            else:
                note = ""
            self._known[sub.job_id] = not note
            if note:
                self.warnings.append(f"{note}: its state is unknown here and its runs are left as they are")
        return self._known[sub.job_id]

    def refresh(self, *, max_age: float = 0.0, record: bool = True, now: float | None = None) -> list[TaskView]:
        """Every recorded task with its phase.  Slurm is asked again when its last answer is older
        than ``max_age`` seconds (in between only the run directories are looked at).  With
        ``record``, a task Slurm ended without writing ``result.json`` gets one from Slurm's state
        (after ``grace`` seconds for a COMPLETED / FAILED / vanished task, whose own result may
        still be on its way through a shared file system), and a task cancelled before it
        started has its run directory removed."""
        subs = [s for s in self.submissions if not s.finalized]
        pending = [(s, t) for s in subs for t in s.tasks if self.result_status(t.run_dir) is None
                   and t.run_dir.is_dir()]
        if pending and time.monotonic() - self._queried_at >= max_age:
            ours = [s for s in subs if self._ours(s)]
            by_name: dict[str, list[str]] = {}
            for s in ours:
                by_name.setdefault(s.job_name, []).append(s.job_id)
            states: dict[tuple[str, int], TaskState] = {}
            for name, ids in by_name.items():
                wanted = [(s.job_id, t.index) for s in ours if s.job_id in ids for t in s.tasks]
                states.update(self._query(ids, job_name=name or None, config=self.config, tasks=wanted))
            self._states = states
            self._queried_at = time.monotonic()
        now = time.time() if now is None else now
        views: list[TaskView] = []
        for sub in self.submissions:
            if sub.finalized:
                views.extend(TaskView(sub, t, "finished" if self.result_status(t.run_dir) else "dropped",
                                      status=self.result_status(t.run_dir)) for t in sub.tasks)
                continue
            for task in sub.tasks:
                views.append(self._view(sub, task, now, record))
            if record and all(v.phase in ("finished", "dropped") for v in views if v.submission is sub):
                sub.finalized = True
                _mark_finalized(sub)
        return views

    def result_status(self, run_dir: Path) -> str | None:
        """The status in the run's ``result.json``, None while it has none (remembered once read)."""
        if run_dir in self._status:
            return self._status[run_dir]
        try:
            status = loads((run_dir / RESULT).read_bytes()).get("status")  # never a RecursionError
        except (OSError, ValueError, AttributeError):
            return None
        self._status[run_dir] = str(status)
        return self._status[run_dir]

    def _view(self, sub: Submission, task: TaskEntry, now: float, record: bool) -> TaskView:
        status = self.result_status(task.run_dir)
        if status is not None:
            return TaskView(sub, task, "finished", status=status)
        if not task.run_dir.is_dir():
            return TaskView(sub, task, "dropped")
        if not self._ours(sub):
            return TaskView(sub, task, "unknown")
        state = self._states.get((sub.job_id, task.index))
        started = (task.run_dir / TASK_RECORD).exists()  # fresher than the last squeue
        if state is not None and state.active:
            return TaskView(sub, task, "queued" if state.queued and not started else "running", state)
        if state is None:  # Slurm keeps no record of it (any more): it is not running
            state = TaskState("UNKNOWN", source="none")
        elif state.state == "CANCELLED" and not started:
            if record and remove_unstarted(task.run_dir):
                return TaskView(sub, task, "dropped", state)
        ended = state.end or self._first_ended.setdefault(task.run_dir, now)
        grace = sub.grace if sub.grace is not None else self.settings.grace
        believe = state.state not in ("COMPLETED", "FAILED", "UNKNOWN") or now >= ended + grace
        if not record or not believe:
            return TaskView(sub, task, "ending", state)
        status = write_result_from_slurm(task, sub, state, ended_at=ended)
        self._status[task.run_dir] = status
        return TaskView(sub, task, "finished", state, status=status)

    def active_job_ids(self, views: Sequence[TaskView]) -> list[str]:
        return sorted({v.submission.job_id for v in views if v.phase in ("queued", "running")})

    def cancel(self) -> list[str]:
        """``scancel`` every recorded job of this sweep that still has queued or running tasks."""
        ids = self.active_job_ids(self.refresh(record=False))
        scancel(ids)
        self._queried_at = -math.inf
        return ids

    def wait_ended(self, timeout: float, *, poll: float = 0.5) -> bool:
        """Wait until no recorded task is queued or running (scancel'd tasks end when their traps
        have removed their containers); True if they all ended in time."""
        deadline = time.monotonic() + timeout
        while True:
            views = self.refresh(record=False)
            if not any(v.phase in ("queued", "running") for v in views):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(poll)


def _mark_finalized(sub: Submission) -> None:
    path = sub.directory / JOB
    try:
        job = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    job["finalized"] = True
    write_json_atomic(path, job)


def remove_unstarted(run_dir: Path) -> bool:
    """Remove the run directory of a task that never started (only its spec.json is there);
    False when the task left more than that."""
    names = {p.name for p in run_dir.iterdir()}
    if names - {SPEC}:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        run_dir.parent.rmdir()  # the cell's directory, when this was its only run
    except OSError:
        pass
    return True


def _iso(ts: float | None) -> str:
    return datetime.fromtimestamp(ts if ts else time.time(), timezone.utc).isoformat()


def write_result_from_slurm(task: TaskEntry, sub: Submission, state: TaskState, *, ended_at: float) -> str:
    """``result.json`` for a task Slurm ended before it could write one; returns the status."""
    spec = json.loads((task.run_dir / SPEC).read_text())
    try:
        record = json.loads((task.run_dir / TASK_RECORD).read_text())
    except (OSError, ValueError):
        record = {}
    status = RUN_STATUS.get(state.state, "failed")
    started = record.get("started_at") or _iso(state.start or ended_at)
    try:
        wall = max(0.0, ended_at - datetime.fromisoformat(started).timestamp())
    except ValueError:
        wall = 0.0
    note = _slurm_note(state, sub, task)
    tail = tail_text(task.run_dir / STDERR, ERROR_TAIL_BYTES // 2) + tail_text(sub.log(task.index), ERROR_TAIL_BYTES // 2)
    for node_log in sorted((task.run_dir / NODES_DIR).glob(f"node-*/{STDERR}")):  # a multi-node cell's other nodes
        text = tail_text(node_log, ERROR_TAIL_BYTES // 4).strip()
        if text:
            tail += f"\n[{node_log.parent.name}] {text}"
    image = None
    try:  # the docker runtime's record, when the container ended before the task was stopped
        image = json.loads((task.run_dir / CONTAINER_JSON).read_text()).get("image")
    except (OSError, ValueError):
        pass
    outcome = RunOutcome(status=status, exit_code=state.exit_code if state.signal is None else None,
                         error_tail=f"{tail.strip()}\n[matrun] {note}".lstrip("\n")[-ERROR_TAIL_BYTES:],
                         started_at=started, ended_at=_iso(ended_at), wall_seconds=round(wall, 3), image=image)
    host = record.get("host") or ({"hostname": state.node} if state.node else None)
    key = RunKey(spec["sweep"], spec["cell_id"], int(spec["repeat"]), int(spec["attempt"]))
    write_result(key, task.run_dir, spec["env_id"], "slurm", host, outcome)
    return status


def _slurm_note(state: TaskState, sub: Submission, task: TaskEntry) -> str:
    where = f"job {sub.job_id}_{task.index}" + (f" on {state.node}" if state.node else "")
    if state.state == "UNKNOWN":
        return (f"Slurm no longer knows {where} and the task left no result.json (it ended; neither "
                "squeue, the jobcomp log nor sacct has its state)")
    text = f"Slurm ended {where}: JobState={state.state}"
    if state.state in ("TIMEOUT", "DEADLINE") and state.time_limit:
        text += f" (time limit {state.time_limit} min)"
    if state.signal:
        text += f", killed by signal {state.signal}"
    elif state.exit_code is not None:
        text += f", exit code {state.exit_code}"
    if state.state in ("COMPLETED", "FAILED"):
        text += "; the task ended without writing result.json (see the task log above)"
    return f"{text} [{state.source}]"


def sweep_dirs_with_jobs(paths: Iterable[Path]) -> list[Path]:
    """Sweep directories holding Slurm submissions: each path itself, or its children (a results
    directory)."""
    found = []
    for path in paths:
        if (path / JOBS_DIR).is_dir():
            found.append(path)
        elif path.is_dir():
            found.extend(child for child in sorted(path.iterdir()) if (child / JOBS_DIR).is_dir())
    return found


def reconcile(paths: Iterable[Path], *, grace: float | None = None) -> tuple[int, list[str]]:
    """For ``matrun ingest``: write ``result.json`` for tasks Slurm ended without one, under these
    paths.  Returns (results written, notes); quiet when there are no submissions."""
    written, notes = 0, []
    dirs = sweep_dirs_with_jobs(paths)
    for sweep_dir in dirs:
        settings = SlurmSettings() if grace is None else SlurmSettings(grace=grace)
        jobs = SweepJobs(sweep_dir, settings)
        if not jobs.submissions:
            continue
        before = {t.run_dir for s in jobs.submissions for t in s.tasks if (t.run_dir / RESULT).exists()}
        try:
            views = jobs.refresh()
        except SlurmUnavailable as exc:
            notes.append(f"{sweep_dir}: Slurm's state not read ({exc}); runs Slurm ended without a result "
                         "are recorded where Slurm answers (matrun sweep / matrun ingest there)")
            continue
        written += sum(1 for v in views if v.phase == "finished" and v.run_dir not in before)
        waiting = sum(1 for v in views if v.in_flight)
        if waiting:
            notes.append(f"{sweep_dir}: {waiting} run(s) still queued or running in Slurm")
        notes.extend(jobs.warnings)
    return written, notes


def cell_progress(sweep_dir: Path) -> tuple[dict[str, dict[str, int]], list[str]] | None:
    """For ``matrun status``: per cell id, its recorded tasks by phase (queued, running, done,
    failed); None when the sweep has no Slurm submissions.  Writes nothing."""
    jobs = SweepJobs(sweep_dir, include_finalized=True)
    if not jobs.submissions:
        return None
    notes: list[str] = []
    try:
        views = jobs.refresh(record=False)
    except SlurmUnavailable as exc:
        notes.append(f"Slurm's state not read: {exc}")
        views = [TaskView(s, t, "unknown") for s in jobs.submissions for t in s.tasks]
        for v in views:
            status = jobs.result_status(v.run_dir)
            if status:
                v.phase, v.status = "finished", status
    notes.extend(jobs.warnings)
    cells: dict[str, dict[str, int]] = {}
    for v in views:
        counts = cells.setdefault(v.entry.cell_id, {"queued": 0, "running": 0, "done": 0, "failed": 0})
        if v.phase == "finished":
            counts["done" if v.status == "ok" else "failed"] += 1
        elif v.phase == "ending":
            counts["running"] += 1
        elif v.phase in counts:
            counts[v.phase] += 1
    return cells, notes
