"""Slurm, used as it is: settings, Slurm's own record of tasks, and a local one-node test cluster.

matrun schedules nothing itself.  The slurm executor (``runner/slurm/executor.py``) submits
job arrays with ``sbatch`` and reads back what Slurm says about each task.  This module holds
the parts that do not depend on the executor:

- ``SlurmSettings``: the ``[slurm]`` section of matrix.toml and the ``matrun sweep`` flags that
  override it, validated value by value (``check_*``).  No value ever reaches a shell: sbatch is
  called with an argument list, and the batch script is the same constant text for every sweep.
- Reading task states without slurmdbd: ``squeue --json -t all`` while Slurm still lists a job
  (``MinJobAge``, 300 s by default, after it ends), then the ``jobcomp/filetxt`` log, then
  ``sacct`` where accounting exists (``parse_squeue_json``, ``parse_jobcomp``, ``parse_sacct``).
- A local test cluster for tests and for trying the executor (``start_cluster`` /
  ``stop_cluster``): a private ``munged``, ``slurmctld -D`` and three ``slurmd -D`` started in
  their own sessions, their PIDs recorded; stopped by those PIDs only, each checked to still be
  the daemon it was.  It listens on 127.0.0.1 only as far as its peers go
  (SlurmctldHost=localhost, NodeAddr=127.0.0.1).  Node ``node0`` (the default partition
  ``matrun``, this host's CPUs) has two fake GPUs (character devices 195:N under its state
  directory) so ``--gres=gpu:N`` schedules; nodes ``n1`` and ``n2`` (partition ``multi``, one CPU
  each, slurmds of their own on this host) let a multi-node cell be scheduled on two nodes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from matrun.errors import InputError, MatrunError

# --- settings --------------------------------------------------------------------------------

#: Partition, account and QOS names: letters, digits, '_', '.', '-' ('+' in QOS names too);
#: a partition may be a comma-separated list.  Nothing that could be read as an option.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}$")
#: sbatch flags a matrix may add (``sbatch_args``): site-specific placement and bookkeeping.
#: Everything matrun sets itself (array, resources, time, output, working directory,
#: environment, requeue) and everything that changes which cluster or user is refused.
ALLOWED_SBATCH_FLAGS = frozenset({
    "constraint", "nodelist", "exclude", "reservation", "nice", "comment", "mail-type", "mail-user",
    "licenses", "cpu-freq", "hint", "mem-bind", "tmp", "prefer", "begin", "deadline", "priority",
    "wckey", "switches", "core-spec", "thread-spec", "sockets-per-node", "cores-per-socket",
    "threads-per-core", "gres-flags", "network", "propagate", "distribution", "delay-boot",
    "acctg-freq", "profile", "gpu-bind", "gpu-freq", "mcs-label", "power", "contiguous", "spread-job",
    "use-min-nodes",
})
_VALUELESS_FLAGS = frozenset({"contiguous", "spread-job", "use-min-nodes"})
_SBATCH_ARG = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?$", re.S)
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")
SLURM_KEYS = ("partition", "account", "qos", "exclusive", "throttle", "time_margin", "max_time",
              "sbatch_args", "python", "poll_interval", "grace", "runtime")
RUNTIMES = ("docker", "local")


@dataclass(frozen=True)
class SlurmSettings:
    """How cells are submitted.  Defaults suit a shared production cluster."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    exclusive: bool = True  # a benchmark does not share its node
    throttle: int = 0  # at most this many tasks of one array at once (0: Slurm's limit only)
    time_margin: float = 300.0  # seconds added to the cell's timeout for the task's time limit
    max_time: int = 0  # minutes: cap of a task's time limit (a partition's MaxTime); 0: none
    sbatch_args: tuple[str, ...] = ()
    python: str | None = None  # interpreter with matrun installed, as the nodes see it (default: this one)
    poll_interval: float = 10.0  # seconds between two squeue calls while a sweep waits
    grace: float = 30.0  # seconds after a task ended before a missing result.json is believed
    # how a task runs its cell on the node: "docker" (the docker executor: the cell's image,
    # --network none) or "local" (the local executor: matrun's environments, which the nodes
    # see at the same path; the host's network, so the only runtime for multi-node cells)
    runtime: str = "docker"

    def merged(self, overrides: Mapping[str, Any]) -> "SlurmSettings":
        """These settings with command-line overrides (``None`` values ignored), each checked;
        ``InputError`` names the flag."""
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if value is None or (key == "sbatch_args" and not value):
                continue
            try:
                changes[key] = check_setting(key, list(value) if key == "sbatch_args" else value)
            except ValueError as exc:
                flag = "--sbatch-arg" if key == "sbatch_args" else f"--{key.replace('_', '-')}"
                raise InputError(f"{flag}: {exc}") from None
        return replace(self, **changes)


def _show(value: Any) -> str:
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_name(value: Any, *, what: str, several: bool = False) -> str:
    """A partition / account / QOS name; ``ValueError`` otherwise."""
    parts = value.split(",") if isinstance(value, str) and several else [value]
    if not isinstance(value, str) or not all(isinstance(p, str) and _NAME.match(p) for p in parts):
        extra = "; several separated by ','" if several else ""
        article = "an" if what[0] in "aeiou" else "a"
        raise ValueError(f"expected {article} {what} name of letters, digits, '_', '.', '+' or '-'{extra}, "
                         f"got {_show(value)}")
    return value


def check_sbatch_arg(value: Any) -> str:
    """One extra sbatch flag, ``--name=value`` (or ``--name`` for a valueless flag) of the allowed set."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string such as \"--constraint=avx512\", got {_show(value)}")
    match = _SBATCH_ARG.match(value)
    if not match:
        raise ValueError(f"expected the long form --name=value, e.g. \"--constraint=avx512\", got {_show(value)}")
    name, arg = match.groups()
    if name not in ALLOWED_SBATCH_FLAGS:
        raise ValueError(f"sbatch flag --{name} is not allowed here (matrun sets the array, resources, time, "
                         f"output and environment itself); allowed: {', '.join(sorted(ALLOWED_SBATCH_FLAGS))}")
    if name in _VALUELESS_FLAGS:
        if arg is not None:
            raise ValueError(f"--{name} takes no value, got {_show(value)}")
    elif arg is None or not _PRINTABLE.match(arg):
        raise ValueError(f"--{name} needs a value of 1 to 256 printable characters, got {_show(value)}")
    return value


def check_setting(key: str, value: Any) -> Any:
    """The canonical value of one ``[slurm]`` key, or ``ValueError`` with the user's words."""
    if key in ("partition", "account", "qos"):
        return check_name(value, what={"qos": "QOS"}.get(key, key), several=key == "partition")
    if key == "exclusive":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_show(value)}")
        return value
    if key in ("throttle", "max_time"):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
            unit = "tasks at once" if key == "throttle" else "minutes"
            raise ValueError(f"expected a whole number of {unit} from 0 (no limit) to 1000000, got {_show(value)}")
        return value
    if key in ("time_margin", "grace", "poll_interval"):
        low = 1.0 if key == "poll_interval" else 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= 86_400:
            raise ValueError(f"expected seconds from {low:g} to 86400, got {_show(value)}")
        return float(value)
    if key == "sbatch_args":
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list of strings such as [\"--constraint=avx512\"], got {_show(value)}")
        return tuple(check_sbatch_arg(v) for v in value)
    if key == "runtime":
        if value not in RUNTIMES:
            raise ValueError(f"expected one of {', '.join(repr(r) for r in RUNTIMES)}, got {_show(value)}")
        return value
    if key == "python":
        if not isinstance(value, str) or not value.startswith("/") or not _PRINTABLE.match(value) or "/../" in value:
            raise ValueError(f"expected the absolute path of a Python interpreter with matrun installed, got {_show(value)}")
        return value
    raise ValueError(f"unknown key; expected one of {', '.join(SLURM_KEYS)}")


def parse_slurm_section(raw: Any, add_error: Callable[[tuple[Any, ...], str], None]) -> SlurmSettings:
    """``[slurm]`` of matrix.toml; every problem goes to ``add_error(key path, message)``."""
    if not isinstance(raw, dict):
        add_error(("slurm",), f"expected a table, got {_show(raw)}")
        return SlurmSettings()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            values[key] = check_setting(key, value)
        except ValueError as exc:
            add_error(("slurm", key), str(exc))
    return SlurmSettings(**values)


# --- Slurm's record of tasks -----------------------------------------------------------------

#: States of a job that has not ended (a COMPLETING job still has processes on its node).
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                           "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                           "RESV_DEL_HOLD", "SPECIAL_EXIT", "POWER_UP_NODE", "UPDATE_DB"})
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
                           "SPECIAL_EXIT", "POWER_UP_NODE", "CONFIGURING"})
#: A task Slurm ended, as a run status.  COMPLETED and FAILED tasks wrote their own result.json
#: (the task exits 1 for a run that was not ok); a task that could not is ``failed``.
RUN_STATUS = {"COMPLETED": "failed", "FAILED": "failed", "TIMEOUT": "timeout", "DEADLINE": "timeout",
              "OUT_OF_MEMORY": "oom", "NODE_FAIL": "failed", "BOOT_FAIL": "failed", "CANCELLED": "cancelled",
              "PREEMPTED": "cancelled", "REVOKED": "cancelled", "LAUNCH_FAILED": "failed"}


@dataclass(frozen=True)
class TaskState:
    """What Slurm says about one array task."""

    state: str  # Slurm's JobState, e.g. PENDING, RUNNING, COMPLETED, TIMEOUT, OUT_OF_MEMORY
    exit_code: int | None = None
    signal: int | None = None
    start: float | None = None  # unix seconds
    end: float | None = None
    node: str | None = None
    reason: str | None = None
    time_limit: int | None = None  # minutes
    source: str = "squeue"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def queued(self) -> bool:
        return self.state in QUEUED_STATES


TaskKey = tuple[str, int]  # (array job id, task index)


def decode_exit(raw: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from squeue's ``exit_code``: a wait status (22.05) or an object (23+)."""
    if isinstance(raw, dict):
        code = raw.get("return_code")
        sig = raw.get("signal") or {}
        sig_id = sig.get("id") if isinstance(sig, dict) else None
        if isinstance(code, dict):  # 24.x: {"set": true, "number": 0}
            code = code.get("number")
        if isinstance(sig_id, dict):
            sig_id = sig_id.get("number")
        return (int(code) if isinstance(code, int) else None), (int(sig_id) if sig_id else None)
    if isinstance(raw, int) and raw >= 0:
        if raw & 0x7F:
            return None, raw & 0x7F
        return (raw >> 8) & 0xFF, None
    return None, None


def _number(value: Any) -> int | None:
    if isinstance(value, dict):  # 23+: {"set": true, "infinite": false, "number": 123}
        value = value.get("number") if value.get("set", True) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _state(value: Any) -> str:
    if isinstance(value, list):  # 23+: ["RUNNING", "COMPLETING"]
        if "COMPLETING" in value:
            return "COMPLETING"
        return str(value[0]) if value else "UNKNOWN"
    return str(value or "UNKNOWN")


def expand_indices(text: str) -> list[int]:
    """Array task ids of a pending record, e.g. ``"2-4%2"`` or ``"1,3,5-7:2"``."""
    out: list[int] = []
    for part in text.split("%", 1)[0].split(","):
        part = part.strip()
        if not part:
            continue
        span, _, step = part.partition(":")
        lo, _, hi = span.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (step and not step.isdigit()):
            continue
        out.extend(range(int(lo), int(hi or lo) + 1, int(step or 1) or 1))
    return out


def parse_squeue_json(text: str, *, job_ids: Iterable[str] | None = None,
                      job_name: str | None = None) -> dict[TaskKey, TaskState]:
    """Task states from ``squeue --json -t all`` (its filters are ignored in 22.05: filter here)."""
    wanted = {str(j) for j in job_ids} if job_ids is not None else None
    doc = json.loads(text)
    found: dict[TaskKey, TaskState] = {}
    for job in doc.get("jobs") or []:
        array_id = _number(job.get("array_job_id"))
        if not array_id:
            continue
        key_id = str(array_id)
        if wanted is not None and key_id not in wanted:
            continue
        if job_name is not None and job.get("name") != job_name:
            continue
        code, sig = decode_exit(job.get("exit_code"))
        state = TaskState(state=_state(job.get("job_state")), exit_code=code, signal=sig,
                          start=_number(job.get("start_time")) or None, end=_number(job.get("end_time")) or None,
                          node=job.get("nodes") or job.get("batch_host") or None,
                          reason=job.get("state_reason") or None, time_limit=_number(job.get("time_limit")))
        task = _number(job.get("array_task_id"))
        if task is not None:
            found[(key_id, task)] = state
        else:  # the pending rest of an array, one record
            for index in expand_indices(str(job.get("array_task_string") or "")):
                found.setdefault((key_id, index), replace(state, start=None, end=None))
    return found


_KV = re.compile(r"(\w+)=(\S*)")


def _time(text: str | None) -> float | None:
    if not text or text in ("Unknown", "None", "0"):
        return None
    try:  # Slurm writes local time without a zone; a naive datetime's timestamp() reads it so
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    code, _, sig = (text or "").partition(":")
    if not code.isdigit():
        return None, None
    return (None, int(sig)) if sig.isdigit() and int(sig) else (int(code), None)


def parse_jobcomp(text: str, *, job_ids: Iterable[str] | None = None,
                  job_name: str | None = None) -> dict[TaskKey, TaskState]:
    """Ended tasks from a ``jobcomp/filetxt`` log: one ``Key=Value …`` line per job (the last wins)."""
    wanted = {str(j) for j in job_ids} if job_ids is not None else None
    found: dict[TaskKey, TaskState] = {}
    for line in text.splitlines():
        fields = dict(_KV.findall(line))
        array_id, task = fields.get("ArrayJobId", ""), fields.get("ArrayTaskId", "")
        if not array_id.isdigit() or not task.isdigit() or array_id == "0":
            continue
        if wanted is not None and array_id not in wanted:
            continue
        if job_name is not None and fields.get("Name") != job_name:
            continue
        code, sig = _exit_pair(fields.get("ExitCode"))
        limit = fields.get("TimeLimit", "")
        found[(array_id, int(task))] = TaskState(
            state=fields.get("JobState", "UNKNOWN"), exit_code=code, signal=sig,
            start=_time(fields.get("StartTime")), end=_time(fields.get("EndTime")),
            node=fields.get("NodeList") or None, time_limit=int(limit) if limit.isdigit() else None,
            source="jobcomp")
    return found


def parse_sacct(text: str) -> dict[TaskKey, TaskState]:
    """``sacct -X -n -P -o JobID,State,ExitCode,Start,End,NodeList`` lines (``123_4|COMPLETED|0:0|…``)."""
    found: dict[TaskKey, TaskState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3:
            continue
        job, _, task = parts[0].partition("_")
        if not job.isdigit() or not task.isdigit():
            continue
        code, sig = _exit_pair(parts[2])
        state = parts[1].split()[0] if parts[1] else "UNKNOWN"  # "CANCELLED by 0"
        found[(job, int(task))] = TaskState(
            state=state, exit_code=code, signal=sig,
            start=_time(parts[3]) if len(parts) > 3 else None, end=_time(parts[4]) if len(parts) > 4 else None,
            node=(parts[5] or None) if len(parts) > 5 else None, source="sacct")
    return found


class SlurmUnavailable(MatrunError):
    """Slurm's commands are missing, or no controller answers."""


def slurm_command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmUnavailable(f"Slurm's {name} is not installed here (Debian: apt-get install slurm-client); "
                               "run matrun on a host that can submit jobs to the cluster")
    return path


def run_slurm(args: list[str], *, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    """A Slurm command (argument list, never a shell), its output as text."""
    argv = [slurm_command(args[0]), *args[1:]]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{args[0]} did not answer within {timeout:.0f} s (is slurmctld running?)") from None
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmUnavailable(f"{' '.join(args[:2])} failed (exit {proc.returncode}): "
                               f"{message[-1] if message else 'no message'}")
    return proc


def node_address(name: str) -> str:
    """The address Slurm reaches node ``name`` at (its ``NodeAddr``): where the other nodes of a
    multi-node cell reach this one."""
    out = run_slurm(["scontrol", "show", "node", "-o", name], timeout=30).stdout
    for item in out.split():
        key, sep, value = item.partition("=")
        if sep and key == "NodeAddr" and value:
            return value
    raise SlurmUnavailable(f"scontrol show node {name} names no NodeAddr")


def cluster_config() -> dict[str, str]:
    """``scontrol show config`` as a dict (ClusterName, JobCompType, JobCompLoc, MinJobAge, KillWait…)."""
    out = run_slurm(["scontrol", "show", "config"], timeout=30).stdout
    config: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def query_states(job_ids: Iterable[str], *, job_name: str | None = None, config: Mapping[str, str] | None = None,
                 tasks: Iterable[TaskKey] | None = None) -> dict[TaskKey, TaskState]:
    """Every task of these array jobs Slurm knows: squeue first; for ``tasks`` squeue no longer
    lists, the jobcomp/filetxt log, then sacct where accounting exists (``config`` is
    ``cluster_config()``).

    Raises ``SlurmUnavailable`` when squeue fails (a controller that does not answer must not
    be read as "every job ended").
    """
    ids = sorted({str(j) for j in job_ids})
    if not ids:
        return {}
    found = parse_squeue_json(run_slurm(["squeue", "--json", "-t", "all"]).stdout,
                              job_ids=ids, job_name=job_name)
    if tasks is not None and all(key in found for key in tasks):
        return found
    extra: dict[TaskKey, TaskState] = {}
    config = config if config is not None else {}
    if config.get("JobCompType", "").endswith("filetxt"):
        try:
            with open(config.get("JobCompLoc", ""), encoding="utf-8", errors="replace") as fh:
                extra.update(parse_jobcomp(fh.read(), job_ids=ids, job_name=job_name))
        except OSError:
            pass
    if shutil.which("sacct") and config.get("AccountingStorageType", "").endswith("slurmdbd"):
        proc = run_slurm(["sacct", "-X", "-n", "-P", "-j", ",".join(ids),
                          "-o", "JobID,State,ExitCode,Start,End,NodeList"], check=False)
        if proc.returncode == 0:
            extra.update(parse_sacct(proc.stdout))
    for key, state in extra.items():
        found.setdefault(key, state)  # squeue, which knows live jobs, wins
    return found


def scancel(job_ids: Iterable[str]) -> None:
    ids = sorted({str(j) for j in job_ids})
    if ids:
        run_slurm(["scancel", *ids], check=False)


# --- a local one-node test cluster ------------------------------------------------------------

CLUSTER_NAME = "matrun"
CTLD_HOST = "localhost"  # slurmctld's host name (at 127.0.0.1)
# The node of the default partition.  Not "localhost": Slurm 22.05 refuses a second node on the
# same host next to a node named localhost ("Duplicated NodeHostName").
NODE = "node0"
FAKE_GPUS = 2
EPILOG = "epilog"  # the test cluster's Epilog script, in its state directory
# Partition "multi": two more nodes on the same host, one CPU each and no GPU, each with its
# own slurmd (Slurm's multiple-slurmd mode: the same NodeHostname, its own port), so that
# multi-node cells (nodes = 2) are scheduled, started by srun on both and tested for real.
MULTI_PARTITION = "multi"
MULTI_NODES = ("n1", "n2")
CLUSTER_START_TIMEOUT = 60.0
_DAEMONS = (*(f"slurmd-{n}" for n in reversed(MULTI_NODES)), "slurmd", "slurmctld", "munged")  # stop order


def _process_name(daemon: str) -> str:
    """The program a recorded daemon runs (``slurmd-n1`` is a slurmd)."""
    return daemon.split("-", 1)[0]


@dataclass(frozen=True)
class LocalCluster:
    """A cluster ``start_cluster`` started: its state directory, slurm.conf and daemon PIDs."""

    state_dir: Path
    conf: Path
    pids: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # from the first daemon's start to the node being idle

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, matrun) needs in its environment to use this cluster."""
        return {"SLURM_CONF": str(self.conf)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_resources() -> tuple[int, int]:
    """(CPUs, memory in MiB) to declare for the node: what this host has, memory with 10 % kept back."""
    cpus = os.cpu_count() or 1
    mem_mb = 1024
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_mb = int(line.split()[1]) // 1024
                    break
    except OSError:
        pass
    return cpus, max(256, int(mem_mb * 0.9))


def cluster_config_text(state_dir: Path, *, ctld_port: int, slurmd_port: int, cpus: int, memory_mb: int,
                        gpus: int = FAKE_GPUS, kill_wait: int = 10, min_job_age: int = 300,
                        multi_ports: Sequence[int] = ()) -> tuple[str, str]:
    """(slurm.conf, gres.conf) of the test cluster (pure): node ``node0`` in the default
    partition, and with ``multi_ports`` (one per name of ``MULTI_NODES``) partition ``multi``."""
    s = state_dir
    conf = "\n".join([
        "# Written by matrun (runner/slurm/cluster.py): a one-node test cluster on this host.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={CTLD_HOST}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={s / 'munge' / 'munge.sock'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={s / 'state'}",
        f"SlurmdSpoolDir={s / 'spool' / '%n'}",
        f"SlurmctldPidFile={s / 'slurmctld.daemon.pid'}",
        f"SlurmdPidFile={s / 'slurmd-%n.daemon.pid'}",
        f"SlurmctldLogFile={s / 'slurmctld.log'}",
        f"SlurmdLogFile={s / 'slurmd-%n.log'}",
        # Containers started by a task are outside Slurm's process tracking either way (the task
        # traps TERM and removes its container); linuxproc needs no cgroup delegation.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        f"DefMemPerCPU={max(64, memory_mb // max(1, cpus) // 4)}",
        "GresTypes=gpu",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={s / 'jobcomp.log'}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "ReturnToService=2",
        f"KillWait={kill_wait}",
        # removes the containers of a task Slurm SIGKILLed (runner/slurm/epilog.py)
        f"Epilog={s / EPILOG}",
        f"MinJobAge={min_job_age}",
        "SchedulerType=sched/backfill",
        f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={CTLD_HOST} Port={slurmd_port} CPUs={cpus} "
        f"RealMemory={memory_mb} "
        f"Gres=gpu:{gpus} State=UNKNOWN",
        *(f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={name} Port={port} CPUs=1 "
          f"RealMemory={max(256, memory_mb // 2)} State=UNKNOWN" for name, port in zip(MULTI_NODES, multi_ports)),
        f"PartitionName=matrun Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        *([f"PartitionName={MULTI_PARTITION} Nodes={','.join(MULTI_NODES)} Default=NO MaxTime=INFINITE State=UP"]
          if multi_ports else []),
        "",
    ])
    gres = (f"NodeName={NODE} Name=gpu File={s / 'dev' / 'nvidia'}[0-{gpus - 1}]\n" if gpus > 1 else
            f"NodeName={NODE} Name=gpu File={s / 'dev' / 'nvidia0'}\n")
    return conf, gres


def epilog_script(python: str) -> str:
    """The test cluster's Epilog: matrun's epilog run by this interpreter (slurmd runs the
    Epilog as an executable with no arguments)."""
    return ("#!/bin/sh\n# Written by matrun (runner/slurm/cluster.py): remove the containers of a matrun task "
            "Slurm killed.\n"
            f"exec {shlex.quote(python)} -m matrun.runner.slurm.epilog\n")


def write_cluster_config(state_dir: Path, **kwargs: Any) -> Path:
    """Write slurm.conf, gres.conf, the fake GPU devices and a munge key; return slurm.conf."""
    state_dir = state_dir.absolute()
    for sub in ("state", "spool", "dev", "munge"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    for path in (state_dir, state_dir / "munge"):
        os.chmod(path, 0o755)  # munged wants its socket directory searchable by all
    cpus, memory_mb = node_resources()
    kwargs.setdefault("cpus", cpus)
    kwargs.setdefault("memory_mb", memory_mb)
    kwargs.setdefault("ctld_port", free_port())
    kwargs.setdefault("slurmd_port", free_port())
    kwargs.setdefault("multi_ports", [free_port() for _ in MULTI_NODES])
    gpus = kwargs.get("gpus", FAKE_GPUS)
    for n in range(gpus):
        dev = state_dir / "dev" / f"nvidia{n}"
        if not dev.exists():  # a fake NVIDIA device: major 195, as the real ones
            os.mknod(dev, 0o600 | 0o020000, os.makedev(195, n))
    key = state_dir / "munge" / "munge.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(1024))
    conf, gres = cluster_config_text(state_dir, **kwargs)
    epilog = state_dir / EPILOG
    epilog.write_text(epilog_script(sys.executable))
    os.chmod(epilog, 0o755)
    (state_dir / "slurm.conf").write_text(conf)
    (state_dir / "gres.conf").write_text(gres)
    return state_dir / "slurm.conf"


def _pid_file(state_dir: Path, daemon: str) -> Path:
    return state_dir / f"{daemon}.pid"


def _is_daemon(pid: int, name: str) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return comm == name and state != "Z"


def _spawn(args: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(env), start_new_session=True)  # setsid


def start_cluster(state_dir: Path, *, timeout: float = CLUSTER_START_TIMEOUT, **config: Any) -> LocalCluster:
    """Start munged, ``slurmctld -D`` and ``slurmd -D`` for a one-node cluster under ``state_dir``.

    Needs root and Debian's ``slurmctld slurmd slurm-client munge``.  Each daemon runs in its
    own session; its PID goes to ``state_dir/<daemon>.pid``.  Returns once ``sinfo`` shows the
    node idle; on failure everything started here is stopped again.
    """
    for name, package in (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
                          ("sinfo", "slurm-client")):
        if shutil.which(name) is None:
            raise SlurmUnavailable(f"{name} is not installed (Debian: apt-get install slurmctld slurmd "
                                   f"slurm-client munge; missing: {package})")
    state_dir = state_dir.absolute()
    if len(str(state_dir / "munge" / "munge.sock").encode()) > 100:
        raise InputError(f"state directory {state_dir} is too long for munge's socket path; use a shorter one")
    running = [d for d in _DAEMONS if _recorded(state_dir, d)]
    if running:
        raise InputError(f"a cluster started by matrun already runs from {state_dir} ({', '.join(running)}); "
                         f"stop it first (matrun slurm stop)")
    conf = write_cluster_config(state_dir, **config)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = time.perf_counter()
    munge = state_dir / "munge"
    procs: dict[str, subprocess.Popen] = {}
    commands = {
        "munged": ["munged", "-F", "--force", f"--socket={munge / 'munge.sock'}", f"--key-file={munge / 'munge.key'}",
                   f"--pid-file={munge / 'munged.daemon.pid'}", f"--log-file={munge / 'munged.log'}",
                   f"--seed-file={munge / 'munged.seed'}", "--origin=127.0.0.1"],
        "slurmctld": ["slurmctld", "-D", "-f", str(conf)],
        "slurmd": ["slurmd", "-D", "-N", NODE, "-f", str(conf)],
        **{f"slurmd-{n}": ["slurmd", "-D", "-N", n, "-f", str(conf)] for n in MULTI_NODES},
    }
    try:
        for daemon in ("munged", "slurmctld", "slurmd", *(f"slurmd-{n}" for n in MULTI_NODES)):
            proc = _spawn([shutil.which(commands[daemon][0]) or commands[daemon][0], *commands[daemon][1:]],
                          state_dir / f"{daemon}.out", env)
            procs[daemon] = proc
            _pid_file(state_dir, daemon).write_text(f"{proc.pid}\n")
            if daemon == "munged":
                _wait_for(lambda: (munge / "munge.sock").exists(), proc, "munged", timeout, state_dir)
        deadline = time.perf_counter() + timeout
        while True:
            for daemon, proc in procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{daemon} exited with {proc.returncode} while starting; "
                                           f"see {state_dir / (daemon + '.out')}")
            probe = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=30)
            states = probe.stdout.split()
            if probe.returncode == 0 and states == ["idle"] * (1 + len(MULTI_NODES)):
                break
            if time.perf_counter() > deadline:
                raise SlurmUnavailable(f"the node did not become idle within {timeout:.0f} s "
                                       f"(sinfo: {(probe.stdout + probe.stderr).strip()[-200:]}); "
                                       f"see {state_dir}/*.log")
            time.sleep(0.2)
    except BaseException:
        for daemon in _DAEMONS:  # ours, by the handles we hold (a PID check could race the exec)
            proc = procs.get(daemon)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            _pid_file(state_dir, daemon).unlink(missing_ok=True)
        raise
    pids = {daemon: proc.pid for daemon, proc in procs.items()}
    return LocalCluster(state_dir, conf, pids, time.perf_counter() - started)


def _wait_for(ready: Callable[[], bool], proc: subprocess.Popen, name: str, timeout: float, state_dir: Path) -> None:
    deadline = time.perf_counter() + timeout
    while not ready():
        if proc.poll() is not None:
            raise SlurmUnavailable(f"{name} exited with {proc.returncode}; see {state_dir}")
        if time.perf_counter() > deadline:
            raise SlurmUnavailable(f"{name} did not come up within {timeout:.0f} s; see {state_dir}")
        time.sleep(0.05)


def _recorded(state_dir: Path, daemon: str) -> int | None:
    try:
        pid = int(_pid_file(state_dir, daemon).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_daemon(pid, _process_name(daemon)) else None


def cluster_running(state_dir: Path) -> dict[str, int]:
    """The daemons of the cluster under ``state_dir`` that still run: name → PID."""
    state_dir = state_dir.absolute()
    return {d: pid for d in _DAEMONS if (pid := _recorded(state_dir, d)) is not None}


def stop_cluster(state_dir: Path, *, timeout: float = 30.0) -> list[str]:
    """Cancel every job of the cluster, then stop its daemons by their recorded PIDs (each only
    while /proc says it still is that daemon).  Returns the daemons stopped."""
    state_dir = state_dir.absolute()
    conf = state_dir / "slurm.conf"
    if _recorded(state_dir, "slurmctld") and conf.exists():
        env = {**os.environ, "SLURM_CONF": str(conf)}
        try:  # a job left running would keep its container: let the tasks' traps stop them
            subprocess.run(["scancel", "--full", "-u", str(os.getuid())], env=env, capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=30)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL, timeout=30)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.3)
        except (OSError, subprocess.SubprocessError):
            pass
    stopped = []
    for daemon in _DAEMONS:
        pid = _recorded(state_dir, daemon)
        if pid is None:
            _pid_file(state_dir, daemon).unlink(missing_ok=True)
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        name = _process_name(daemon)
        while time.monotonic() < deadline and not _gone(pid, name):
            time.sleep(0.05)
        if not _gone(pid, name) and _is_daemon(pid, name):
            os.kill(pid, signal.SIGKILL)
            _gone(pid, name)
        _pid_file(state_dir, daemon).unlink(missing_ok=True)
        stopped.append(daemon)
    return stopped


def _gone(pid: int, name: str) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it
        if done == pid:
            return True
    except ChildProcessError:
        pass
    return not _is_daemon(pid, name)


def time_limit_minutes(timeout: float, settings: SlurmSettings) -> int:
    """A task's time limit in whole minutes (Slurm's unit): the cell's timeout plus the margin,
    at most ``max_time`` when set, at least 1."""
    minutes = max(1, math.ceil((timeout + settings.time_margin) / 60.0))
    return min(minutes, settings.max_time) if settings.max_time else minutes
