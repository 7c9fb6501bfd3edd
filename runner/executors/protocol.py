"""The two executor protocols, and what goes in and out of them.

Every executor declares what the sweep asks of it before anything runs (``Executor``: its
``name``, the ``env_id`` of a framework variant, the limits it ``enforces``, its ``refusal`` of a
cell, ``prepare``).  Then it is one of two kinds, and the sweep picks its loop by that kind
(``isinstance``), never by probing attributes:

- ``SyncExecutor`` (local, docker): ``run`` one cell and return when it has ended.  It gets a
  bundle directory with ``spec.json`` already written, runs the harness so that it writes
  ``events.jsonl`` there, samples the cell with the monitor into ``monitor.jsonl``, captures
  ``stdout.log`` / ``stderr.log``, and returns a ``RunOutcome``.  It never writes
  ``result.json``: the sweep does, last.  A failure of the cell is an outcome (failed / timeout
  / oom), never an exception; ``KeyboardInterrupt`` and ``SystemExit`` are the only exceptions
  that pass through, after the cell is stopped.
- ``AsyncExecutor`` (slurm): gets every run of the sweep at once (``submit``, each run's
  directory and ``spec.json`` written) and is then waited on through its record of what it
  submitted (``jobs``: a ``JobTracker``), polled every ``settings.poll_interval`` seconds by the
  sweep's asynchronous loop (``runner/slurm/loop.py``).  Its runs write their own
  ``result.json``; the tracker writes one for a run that was ended before it could.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

from matrun.warehouse.bundles.layout import RunKey


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
    """How a run ended: everything of ``result.json`` that the executor decides."""

    status: str
    exit_code: int | None
    error_tail: str
    started_at: str
    ended_at: str
    wall_seconds: float
    monitor: dict[str, Any] = field(default_factory=dict)
    # The image the cell ran in (the docker runtime: tag, id, repo_digests, content_hash, as
    # ``ImageRef.as_record`` gives it); None where no image was used.
    image: dict[str, Any] | None = None


@dataclass(frozen=True)
class PreparedRun:
    """A run handed to an asynchronous executor: its key, its directory (``spec.json`` written)
    and its cell's parameters."""

    key: RunKey
    run_dir: Path
    params: Mapping[str, Any]


class Executor(ABC):
    """What every executor declares; the sweep asks all of it before anything runs."""

    #: The executor's name, as ``--executor`` and ``result.json`` say it.
    name: ClassVar[str]
    #: The limits it enforces (``memory_limit``, ``cpuset``): a cell asking for one it does not
    #: enforce is refused before anything runs.
    enforces: frozenset[str] = frozenset()

    @abstractmethod
    def env_id(self, framework: str, variant: str) -> str:
        """Identity of the environment a cell of this framework variant runs in."""

    @abstractmethod
    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run the cell, or None (asked before anything runs)."""

    @abstractmethod
    def prepare(self, envs: set[tuple[str, str]], *, log: Callable[[str], None]) -> None:
        """Make every (framework, variant) environment ready before the first cell runs."""


class SyncExecutor(Executor):
    """Runs one cell at a time: the sweep waits for each ``run`` (local, docker)."""

    @abstractmethod
    def run(self, request: RunRequest) -> RunOutcome:
        """Run one cell to completion, timeout or cancellation."""


class TrackedRun(Protocol):
    """One submitted run, as an asynchronous executor's tracker last saw it."""

    @property
    def run_dir(self) -> Path: ...

    @property
    def cell_id(self) -> str: ...

    @property
    def repeat(self) -> int: ...

    #: queued | running | ending | finished | dropped | unknown
    phase: str
    #: ``result.json``'s status, once finished
    status: str | None

    @property
    def in_flight(self) -> bool:
        """Still the scheduler's (or not yet decided): the sweep must not submit this run again."""


class Submitted(Protocol):
    """One accepted submission (a Slurm job array)."""

    job_id: str


class JobTracker(Protocol):
    """An asynchronous executor's record of what a sweep directory has submitted."""

    warnings: list[str]

    def refresh(self, *, max_age: float = 0.0, record: bool = True) -> Sequence[TrackedRun]:
        """Every submitted run with its phase; the scheduler is asked again when its last answer
        is older than ``max_age`` seconds.  With ``record``, a run the scheduler ended without a
        ``result.json`` gets one."""

    def add(self, submission: Any) -> None:
        """Track a submission made since (``AsyncExecutor.submit``'s ``on_submitted``)."""

    def cancel(self) -> list[str]:
        """Cancel every submission with runs still queued or running; the ids cancelled."""

    def wait_ended(self, timeout: float) -> bool:
        """Wait until no run is queued or running; True if that happened within ``timeout``."""


class PollSettings(Protocol):
    """What the asynchronous loop reads of an asynchronous executor's settings."""

    poll_interval: float  # seconds between two questions to the scheduler


class AsyncExecutor(Executor):
    """Gets every run at once and is waited on (slurm); see the module docstring."""

    settings: PollSettings

    @abstractmethod
    def jobs(self, sweep_dir: Path) -> JobTracker:
        """The record of what has been submitted from ``sweep_dir`` (earlier sweeps' too)."""

    @abstractmethod
    def submit(self, sweep_dir: Path, sweep: str, runs: Sequence[PreparedRun], *,
               log: Callable[[str], None] = lambda text: None,
               on_submitted: Callable[[Any], None] = lambda sub: None) -> Sequence[Submitted]:
        """Submit ``runs``; ``on_submitted`` hears of each submission as soon as it is recorded."""
