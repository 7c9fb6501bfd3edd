"""The ``[slurm]`` settings: the section of matrix.toml and the ``matrun sweep`` flags over it.

``SlurmSettings`` holds how cells are submitted; every value is checked one by one
(``check_setting``) with a message in the user's words, and ``parse_slurm_section`` reports each
problem under its key path.  No value ever reaches a shell: sbatch is called with an argument
list, and the batch script is the same constant text for every sweep
(``runner/slurm/executor.py``).  ``time_limit_minutes`` turns a cell's timeout into a task's
time limit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from matrun.errors import InputError

#: Partition, account and QOS names: letters, digits, '_', '.', '-' ('+' in QOS names too);
#: a partition may be a comma-separated list.  Nothing that could be read as an option.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}\Z")
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
_SBATCH_ARG = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?\Z", re.S)
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]{1,256}\Z")
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


def time_limit_minutes(timeout: float, settings: SlurmSettings) -> int:
    """A task's time limit in whole minutes (Slurm's unit): the cell's timeout plus the margin,
    at most ``max_time`` when set, at least 1."""
    minutes = max(1, math.ceil((timeout + settings.time_margin) / 60.0))
    return min(minutes, settings.max_time) if settings.max_time else minutes
