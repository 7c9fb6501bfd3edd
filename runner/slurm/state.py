"""Slurm's record of tasks, read without slurmdbd, and the Slurm commands matrun runs.

matrun schedules nothing itself: it asks Slurm.  A task's state comes from ``squeue --json -t
all`` while Slurm still lists the job (``MinJobAge``, 300 s by default, after it ends), then from
the ``jobcomp/filetxt`` log, then from ``sacct`` where accounting exists (``parse_squeue_json``,
``parse_jobcomp``, ``parse_sacct``; ``query_states`` asks in that order).  Every Slurm command
goes through ``run_slurm``: an argument list, never a shell; ``SlurmUnavailable`` when it is
missing or no controller answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Iterable, Mapping

from matrun.errors import MatrunError

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
