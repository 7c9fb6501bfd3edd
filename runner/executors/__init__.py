"""Executors by name.  ``auto`` resolves to the best one available on this host."""

from __future__ import annotations

from matrun.errors import InputError
from matrun.runner.executors.base import Executor, RunOutcome, RunRequest
from matrun.runner.executors.local import LocalExecutor

EXECUTORS: dict[str, type] = {"local": LocalExecutor}

__all__ = ["Executor", "RunOutcome", "RunRequest", "get_executor", "EXECUTORS"]


def get_executor(name: str) -> tuple[Executor, str]:
    """The executor for ``name`` and a sentence saying what was picked and why."""
    if name == "auto":
        # The Docker and Slurm executors are later work; until then the embedded default runs.
        return LocalExecutor(), "executor: local (auto: the local executor is the embedded default)"
    cls = EXECUTORS.get(name)
    if cls is None:
        raise InputError(f"unknown executor {name!r}; available: auto, {', '.join(EXECUTORS)}")
    return cls(), f"executor: {name}"
