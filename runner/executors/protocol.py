"""The executor protocol: run one cell's harness somewhere and report how it ended.

An executor gets a bundle directory with ``spec.json`` already written, runs the harness
so that it writes ``events.jsonl`` there, samples the cell with the monitor into
``monitor.jsonl``, captures ``stdout.log`` / ``stderr.log``, and returns a ``RunOutcome``.
It never writes ``result.json``: the sweep does, last.  A failure of the cell is an
outcome (failed / timeout / oom), never an exception; ``KeyboardInterrupt`` and
``SystemExit`` are the only exceptions that pass through, after the cell is stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol


@dataclass(frozen=True)
class RunRequest:
    run_dir: Path
    params: Mapping[str, Any]
    env_id: str
    timeout: float
    data_dir: Path
    # A node of a multi-node cell (the slurm executor's tasks, local runtime): the launch plan
    # the task wrote for this node, and where this node's logs and monitor go when it is not
    # node 0 (whose are the bundle's own).  None: the executor plans the cell itself.
    plan: Path | None = None
    log_dir: Path | None = None


@dataclass
class RunOutcome:
    status: str
    exit_code: int | None
    error_tail: str
    started_at: str
    ended_at: str
    wall_seconds: float
    monitor: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    name: str

    def env_id(self, framework: str, variant: str) -> str:
        """Identity of the environment a cell of this framework variant runs in."""

    def prepare(self, envs: set[tuple[str, str]], *, log: Callable[[str], None]) -> None:
        """Make every (framework, variant) environment ready before the first cell runs."""

    def run(self, request: RunRequest) -> RunOutcome:
        """Run one cell to completion, timeout or cancellation."""
