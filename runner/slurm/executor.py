"""The slurm executor: cells as Slurm job arrays, each task running its cell on a node.

matrun writes no scheduler: it submits, Slurm schedules, and matrun reads back what happened
(``runner/slurm/jobs.py``; the sweep's loop that waits is ``runner/slurm/loop.py``).

**Submission** (``SlurmExecutor.submit``).  The runs a sweep has to do are grouped by the
sbatch arguments their cells need (``sbatch_resources``, a pure function: CPUs from the cpuset
or thread count, memory from ``memory_limit``, time limit from the timeout plus a margin,
``--gres=gpu:N`` for gpu cells, ``--exclusive`` unless turned off, partition / account / QOS /
extra flags from ``[slurm]``), and each group is one ``sbatch --array=0-N%throttle`` job.  Every
value is an element of sbatch's argument list, never text for a shell; the batch script is
the constant ``BATCH_SCRIPT``, which gets the interpreter and the submission's ``tasks.json``
as arguments.  Each submission is recorded in its directory ``<results>/<sweep>/.slurm/<id>/``
(``runner/slurm/jobs.py``).  The run directories and their ``spec.json`` exist from submission
on (``matrun status`` shows them).

**Tasks** (``runner/slurm/task.py``) run the cell with the docker executor on the node (or the
local executor: ``[slurm] runtime = "local"``; a multi-node cell's task runs on each of its
nodes through srun) and write ``result.json`` as a local sweep does.  On SIGTERM / SIGINT
(scancel, the time limit) the task removes its container and exits without a result: the run's
status comes from Slurm.  A task SIGKILLed cannot: the nodes' Epilog (``runner/slurm/epilog.py``)
removes its container by the job-id label the docker executor set.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from matrun.errors import InputError
from matrun.runner.environments.system import executor_refusal
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.protocol import AsyncExecutor, PreparedRun
from matrun.runner.harness.cpusets import parse_cpuset as cpuset_cpus
from matrun.runner.slurm.jobs import JOB, JOBS_DIR, SCRIPT, TASKS, Submission, SweepJobs, TaskEntry, remove_unstarted
from matrun.runner.slurm.settings import SlurmSettings, time_limit_minutes
from matrun.runner.slurm.state import SlurmUnavailable, cluster_config, run_slurm
from matrun.warehouse.bundles.layout import SCHEMA_VERSION
from matrun.warehouse.bundles.write import write_json_atomic

TASK_MEMORY_MIB = 512  # the task's own Python process, on top of the container's memory limit
MAX_ARRAY = 1000  # Slurm's default MaxArraySize is 1001: bigger groups go in several arrays

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


# --- the executor ---------------------------------------------------------------------------------

class SlurmExecutor(AsyncExecutor):
    """Submits runs as job arrays; see the module docstring.  An ``AsyncExecutor``: the sweep
    hands it every run at once (``submit``) and waits on ``SweepJobs`` (``jobs``)."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None, *, docker_host: str | None = None) -> None:
        self.settings = settings or SlurmSettings()
        self._docker_host = docker_host
        self.cluster = ""

    @property
    def enforces(self) -> frozenset[str]:
        """What the executor inside each task enforces (docker: memory and CPUs; local: CPUs)."""
        return frozenset({"memory_limit", "cpuset"} if self.settings.runtime == "docker" else {"cpuset"})

    def _inner(self) -> DockerExecutor | LocalExecutor:
        """The executor a task runs its cell with (``runtime``)."""
        return DockerExecutor() if self.settings.runtime == "docker" else LocalExecutor()

    def env_id(self, framework: str, variant: str) -> str:
        """The runtime's: docker, the recipe of the image a task runs the cell in; local, the
        environment's."""
        return self._inner().env_id(framework, variant)

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run the cell, or None (the sweep asks before anything is submitted)."""
        system = executor_refusal(params, 'slurm (runtime "docker")')  # the site's own Python: local only
        if system and self.settings.runtime == "docker":
            return system
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

    def jobs(self, sweep_dir: Path) -> SweepJobs:
        """The job arrays recorded under ``sweep_dir`` and what Slurm says about them."""
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
                        remove_unstarted(run.run_dir)
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
