"""The slurm executor: cells as Slurm job arrays, each task running its cell in a container.

matrun writes no scheduler: it submits, Slurm schedules, and matrun reads back what happened.

**Submission** (``SlurmExecutor.submit``).  The runs a sweep has to do are grouped by the
sbatch arguments their cells need (``sbatch_resources``, a pure function: CPUs from the cpuset
or thread count, memory from ``memory_limit``, time limit from the timeout plus a margin,
``--gres=gpu:N`` for gpu cells, ``--exclusive`` unless turned off, partition / account / QOS /
extra flags from ``[slurm]``), and each group is one ``sbatch --array=0-N%throttle`` job.  Every
value is an element of sbatch's argument list, never text for a shell; the batch script is
the constant ``BATCH_SCRIPT``, which gets the interpreter and the submission's ``tasks.json``
as arguments.  Each submission has a directory ``<results>/<sweep>/.slurm/<id>/`` with
``tasks.json`` (array index → run directory), ``task.sh``, ``job.json`` (the job id, the
cluster, the sbatch arguments) and the tasks' Slurm logs ``task-<index>.log``.  The run
directories and their ``spec.json`` exist from submission on (``matrun status`` shows them).

**Tasks** (``runner/slurm/task.py``) run the cell with the docker executor on the node (or the
local executor: ``[slurm] runtime = "local"``; a multi-node cell's task runs on each of its
nodes through srun) and write ``result.json`` as a local sweep does.  On SIGTERM / SIGINT (scancel, the time limit)
the task removes its container and exits without a result: the run's status comes from Slurm.
A task SIGKILLed cannot: the nodes' Epilog (``runner/slurm/epilog.py``) removes its container
by the job-id label the docker executor set.

**State** (``SweepJobs.refresh``).  ``squeue --json -t all`` while Slurm lists the job, then the
``jobcomp/filetxt`` log, then ``sacct`` where there is accounting (``runner/slurm/cluster.py``).  A task
Slurm ended without a ``result.json`` gets one written from Slurm's state (TIMEOUT → timeout,
OUT_OF_MEMORY → oom, CANCELLED → cancelled, NODE_FAIL / FAILED / anything else → failed, with
Slurm's exit code and the end of the task's log), so every run that started lands in the
warehouse; a task cancelled before it started leaves nothing (its run directory is removed).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from matrun.errors import InputError, MatrunError
from matrun.warehouse.bundles.write import (
    ERROR_TAIL_BYTES, RESULT, SCHEMA_VERSION, SPEC, STDERR, RunKey, tail_text, write_json_atomic,
)
from matrun.runner.executors.protocol import RunOutcome, RunRequest
from matrun.runner.planning.params import cpuset_cpus
from matrun.runner.slurm.cluster import (
    RUN_STATUS, SlurmSettings, SlurmUnavailable, TaskState, cluster_config, query_states, run_slurm, scancel,
    time_limit_minutes,
)

JOBS_DIR = ".slurm"
TASKS = "tasks.json"
JOB = "job.json"
SCRIPT = "task.sh"
TASK_RECORD = "slurm.json"  # in a run directory: written by the task when it starts
TASK_MEMORY_MIB = 512  # the task's own Python process, on top of the container's memory limit
MAX_ARRAY = 1000  # Slurm's default MaxArraySize is 1001: bigger groups go in several arrays
_SUBMISSION = re.compile(r"^[0-9T]+-[0-9]+-[0-9]+$")

#: The batch script of every task, the same text for every sweep.  What the task runs comes
#: from its two arguments, which sbatch hands over without a shell.
BATCH_SCRIPT = """#!/bin/sh
# matrun: one task of a Slurm job array (runner/slurm/executor.py).  This text is the same for
# every sweep; the interpreter and the submission's tasks.json come as arguments from sbatch.
# A multi-node cell's task has several nodes: srun starts the task once on each of them.
if [ "$SLURM_JOB_NUM_NODES" -gt 1 ] 2>/dev/null; then
  exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$1" -m matrun.runner.slurm.task "$2"
fi
exec "$1" -m matrun.runner.slurm.task "$2"
"""


# --- sbatch arguments (pure) ---------------------------------------------------------------------

def cpus_per_task(params: Mapping[str, Any]) -> int:
    """CPUs a cell needs: its cpuset's size, else its thread count (a multi-worker cell's threads
    are shared by its workers, each at least one), else one per worker."""
    cpus = cpuset_cpus(params.get("cpuset") or "")
    if cpus:
        return len(cpus)
    threads = params.get("threads")
    workers = params.get("workers")
    n = threads if isinstance(threads, int) and not isinstance(threads, bool) else 1
    if isinstance(workers, int) and not isinstance(workers, bool):
        n = max(n, workers)
    return n


def sbatch_resources(params: Mapping[str, Any], settings: SlurmSettings, *, job_name: str) -> list[str]:
    """The sbatch arguments of one cell's task (exact; tested)."""
    args = [f"--job-name={job_name}", f"--cpus-per-task={cpus_per_task(params)}"]
    nodes = int(params.get("nodes") or 1)
    if nodes > 1:  # one task per node, each with the CPUs of that node's workers
        args += [f"--nodes={nodes}", "--ntasks-per-node=1"]
    memory = params.get("memory_limit") or 0
    if memory:
        args.append(f"--mem={math.ceil(memory / 2**20) + TASK_MEMORY_MIB}M")
    args.append(f"--time={time_limit_minutes(float(params['timeout']), settings)}")
    if params.get("device") == "gpu":
        args.append(f"--gres=gpu:{int(params.get('gpus') or 1)}")
    if settings.exclusive:
        args.append("--exclusive")
    for key in ("partition", "account", "qos"):
        value = getattr(settings, key)
        if value:
            args.append(f"--{key}={value}")
    args.append("--no-requeue")  # a task that failed is re-run by the next sweep, as a new attempt
    args.extend(settings.sbatch_args)
    return args


def array_arguments(n_tasks: int, throttle: int, workdir: Path) -> list[str]:
    """The array, where its logs go and how sbatch answers (exact; tested)."""
    spec = f"0-{n_tasks - 1}" + (f"%{throttle}" if throttle else "")
    return ["--parsable", f"--array={spec}", f"--chdir={workdir}", "--output=task-%a.log"]


def task_params(params: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The cell's parameters as the task hands them to the docker executor: a gpu cell gets the
    GPUs Slurm allocated (``SLURM_JOB_GPUS``, the node's own numbering; the first ``gpus`` of
    them) as ``gpu_ids``, so the container is given those devices and not simply the node's first N."""
    out = dict(params)
    gpus = environ.get("SLURM_JOB_GPUS") or environ.get("SLURM_STEP_GPUS") or ""
    if out.get("device") == "gpu" and not out.get("gpu_ids") and re.fullmatch(r"\d+(,\d+)*", gpus):
        # an exclusive node lends the task all its GPUs: the cell takes the first of them it asked for
        out["gpu_ids"] = [int(g) for g in gpus.split(",")][:int(out.get("gpus") or 1)]
    return out


def job_name(sweep: str) -> str:
    return f"matrun-{sweep}"


# --- what was submitted -------------------------------------------------------------------------

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
        """``query`` (``runner/slurm/cluster.py: query_states``) and ``config`` (``scontrol show config``,
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
        pending = [(s, t) for s in subs for t in s.tasks if self._result_status(t.run_dir) is None
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
                views.extend(TaskView(sub, t, "finished" if self._result_status(t.run_dir) else "dropped",
                                      status=self._result_status(t.run_dir)) for t in sub.tasks)
                continue
            for task in sub.tasks:
                views.append(self._view(sub, task, now, record))
            if record and all(v.phase in ("finished", "dropped") for v in views if v.submission is sub):
                sub.finalized = True
                _mark_finalized(sub)
        return views

    def _result_status(self, run_dir: Path) -> str | None:
        if run_dir in self._status:
            return self._status[run_dir]
        try:
            status = json.loads((run_dir / RESULT).read_text()).get("status")
        except (OSError, ValueError):
            return None
        self._status[run_dir] = str(status)
        return self._status[run_dir]

    def _view(self, sub: Submission, task: TaskEntry, now: float, record: bool) -> TaskView:
        status = self._result_status(task.run_dir)
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
            if record and _remove_unstarted(task.run_dir):
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


def _remove_unstarted(run_dir: Path) -> bool:
    """Remove the run directory of a task that never started (only its spec.json is there)."""
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
    from matrun.runner.sweep import write_result

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
    for node_log in sorted((task.run_dir / "nodes").glob(f"node-*/{STDERR}")):  # a multi-node cell's other nodes
        text = tail_text(node_log, ERROR_TAIL_BYTES // 4).strip()
        if text:
            tail += f"\n[{node_log.parent.name}] {text}"
    outcome = RunOutcome(status=status, exit_code=state.exit_code if state.signal is None else None,
                         error_tail=f"{tail.strip()}\n[matrun] {note}".lstrip("\n")[-ERROR_TAIL_BYTES:],
                         started_at=started, ended_at=_iso(ended_at), wall_seconds=round(wall, 3))
    image = None
    try:
        image = json.loads((task.run_dir / "container.json").read_text()).get("image")
    except (OSError, ValueError):
        pass
    outcome.image = image  # type: ignore[attr-defined]
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


# --- the executor ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PreparedRun:
    key: RunKey
    run_dir: Path
    params: Mapping[str, Any]


class SlurmExecutor:
    """Submits runs as job arrays; see the module docstring.  ``asynchronous``: the sweep hands it
    every run at once (``submit``) and waits on ``SweepJobs`` instead of calling ``run``."""

    name = "slurm"
    asynchronous = True

    def __init__(self, settings: SlurmSettings | None = None, *, docker_host: str | None = None) -> None:
        self.settings = settings or SlurmSettings()
        self._docker_host = docker_host
        self.cluster = ""

    @property
    def enforces(self) -> frozenset[str]:
        """What the executor inside each task enforces (docker: memory and CPUs; local: CPUs)."""
        return frozenset({"memory_limit", "cpuset"} if self.settings.runtime == "docker" else {"cpuset"})

    def _inner(self) -> Any:
        from matrun.runner.executors.docker import DockerExecutor
        from matrun.runner.executors.local import LocalExecutor

        return DockerExecutor() if self.settings.runtime == "docker" else LocalExecutor()

    def env_id(self, framework: str, variant: str) -> str:
        """The runtime's: docker, the recipe of the image a task runs the cell in; local, the
        environment's."""
        return self._inner().env_id(framework, variant)

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run the cell, or None (the sweep asks before anything is submitted)."""
        nodes = params.get("nodes")
        if isinstance(nodes, int) and nodes > 1 and self.settings.runtime == "docker":
            return (f"nodes = {nodes}: with runtime \"docker\" each task runs its cell in a container without "
                    "network (--network none), so the workers on different nodes cannot reach each other; "
                    "set runtime = \"local\" in [slurm] (matrun's environments, the hosts' network)")
        return None

    def prepare(self, envs: set[tuple[str, str]], *, log: Callable[[str], None]) -> None:
        """Check that a controller answers; the images are looked up on the nodes by each task."""
        for command in ("sbatch", "squeue", "scancel"):
            if shutil.which(command) is None:
                raise SlurmUnavailable(f"Slurm's {command} is not installed here; run matrun on a host "
                                       "that can submit to the cluster (Debian: apt-get install slurm-client)")
        config = cluster_config()
        self.cluster = config.get("ClusterName", "")
        python = self.settings.python or sys.executable
        needed = ", ".join(f"{fw}:{v}" for fw, v in sorted(envs))
        if self.settings.runtime == "local":
            self._inner().prepare(envs, log=log)  # the nodes see these environments at the same path
            log(f"Slurm cluster {self.cluster or '?'} (Slurm {config.get('SLURM_VERSION', '?')}); tasks run "
                f"{python} -m matrun.runner.slurm.task with the local executor on their node; environments: "
                f"{needed}")
            return
        log(f"Slurm cluster {self.cluster or '?'} (Slurm {config.get('SLURM_VERSION', '?')}); tasks run "
            f"{python} -m matrun.runner.slurm.task with the docker executor on their node; images needed: "
            f"{needed}")

    def run(self, request: RunRequest) -> RunOutcome:
        raise MatrunError("the slurm executor submits job arrays (SlurmExecutor.submit); it runs no cell itself")

    def jobs(self, sweep_dir: Path) -> SweepJobs:
        return SweepJobs(sweep_dir, self.settings)

    def submit(self, sweep_dir: Path, sweep: str, runs: Sequence[PreparedRun], *,
               log: Callable[[str], None] = lambda text: None,
               on_submitted: Callable[[Submission], None] = lambda sub: None) -> list[Submission]:
        """Submit ``runs`` as job arrays, one per group of equal sbatch arguments (in order);
        ``on_submitted`` hears of each array as soon as it is recorded.

        A failed sbatch removes the run directories of what it did not submit and raises
        ``SlurmUnavailable`` with sbatch's message; arrays submitted before it stay recorded.
        """
        if any(ord(c) < 32 for c in str(sweep_dir)):
            raise InputError(f"results directory {sweep_dir!r} contains control characters")
        name = job_name(sweep)
        groups: dict[tuple[str, ...], list[PreparedRun]] = {}
        for run in runs:
            groups.setdefault(tuple(sbatch_resources(run.params, self.settings, job_name=name)), []).append(run)
        chunks = [(args, members[i:i + MAX_ARRAY]) for args, members in groups.items()
                  for i in range(0, len(members), MAX_ARRAY)]
        python = self.settings.python or sys.executable
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        submitted: list[Submission] = []
        for n, (resources, members) in enumerate(chunks):
            directory = sweep_dir / JOBS_DIR / f"{stamp}-{os.getpid()}-{n}"
            directory.mkdir(parents=True)
            entries = [TaskEntry(i, r.run_dir.absolute(), r.key.cell_id, r.key.repeat, r.key.attempt)
                       for i, r in enumerate(members)]
            write_json_atomic(directory / TASKS, {
                "schema_version": SCHEMA_VERSION, "sweep": sweep, "job_name": name,
                "runtime": self.settings.runtime,
                "tasks": [{"index": e.index, "run_dir": str(e.run_dir), "cell_id": e.cell_id,
                           "repeat": e.repeat, "attempt": e.attempt} for e in entries]})
            (directory / SCRIPT).write_text(BATCH_SCRIPT)
            os.chmod(directory / SCRIPT, 0o755)
            argv = ["sbatch", *array_arguments(len(members), self.settings.throttle, directory.absolute()),
                    *resources, str((directory / SCRIPT).absolute()), python, str((directory / TASKS).absolute())]
            submitted_at = time.time()
            proc = run_slurm(argv, check=False)
            job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
            if not job_id.isdigit():
                for _, rest in chunks[n:]:
                    for run in rest:
                        _remove_unstarted(run.run_dir)
                shutil.rmtree(directory, ignore_errors=True)
                done = f" (submitted before it: job {', '.join(s.job_id for s in submitted)})" if submitted else ""
                message = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
                raise SlurmUnavailable(f"sbatch refused the job array{done}: {message}")
            write_json_atomic(directory / JOB, {
                "schema_version": SCHEMA_VERSION, "job_id": job_id, "cluster": self.cluster,
                "job_name": name, "submitted_at": submitted_at, "sbatch": argv[1:], "finalized": False,
                "grace": self.settings.grace, "uid": os.getuid()})
            sub = Submission(directory, job_id, self.cluster, name, submitted_at, entries, grace=self.settings.grace,
                             uid=os.getuid())
            submitted.append(sub)
            on_submitted(sub)
            log(f"submitted job {job_id}: {len(members)} run(s), {' '.join(resources[1:])}")
        return submitted


# --- outside a sweep ---------------------------------------------------------------------------

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
            status = jobs._result_status(v.run_dir)
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
