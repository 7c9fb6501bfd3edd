"""How a run ended, as the executors decide it: one set of rules for every executor.

- ``run_status``: timeout, ok (exit 0 with the harness's summary), oom (a ``MemoryError`` on
  stderr) or failed.  The docker executor adds the engine's OOM kill on top.
- ``error_tail``: the end of the cell's stderr and a ``[matrun]`` line that says why it ended
  (the timeout, the signal that killed it, the exit code).
- ``refused_outcome``: a cell an executor cannot run, failed before anything started.
- ``cancelled_outcome``: a run the sweep was interrupted in.
- ``RunAborted``: an executor that cannot go on (the Docker engine stopped answering
  mid-cell): the run's outcome, which the sweep records before it stops with the error.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime, timezone
from pathlib import Path

from matrun.errors import MatrunError
from matrun.runner.executors.protocol import RunOutcome
from matrun.warehouse.bundles.layout import EVENTS, STDERR, STDOUT
from matrun.warehouse.bundles.write import tail_text


def run_status(exit_code: int | None, timed_out: bool, run_dir: Path, log_dir: Path, *,
               summary: bool = True) -> str:
    """The status of a cell that ended with ``exit_code``: ``summary`` asks for the harness's
    summary in ``run_dir``'s events (node k > 0 of a multi-node cell has none of its own);
    ``log_dir`` holds its stderr."""
    if timed_out:
        return "timeout"
    if exit_code == 0 and (not summary or has_summary(run_dir / EVENTS)):
        return "ok"
    if "MemoryError" in tail_text(log_dir / STDERR, 2048):
        return "oom"
    return "failed"


def has_summary(events: Path) -> bool:
    """Whether the harness wrote its summary event (the end of ``events.jsonl`` is enough)."""
    try:
        with open(events, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            data = fh.read()
        return b'"type": "summary"' in data or b'"type":"summary"' in data
    except FileNotFoundError:
        return False


def error_tail(log_dir: Path, timed_out: bool, timeout: float, exit_code: int | None, *,
               sigkill: str = "possibly the kernel's OOM killer") -> str:
    """The end of ``log_dir``'s stderr and why the cell ended (``exit_code`` < 0: killed by that
    signal, as ``subprocess`` reports it; ``sigkill``: who may have sent a SIGKILL)."""
    tail = tail_text(log_dir / STDERR)
    if timed_out:
        note = f"killed after the cell's timeout of {timeout:g} s"
    elif exit_code is not None and exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else str(-exit_code)
        note = f"killed by {name}" + (f" ({sigkill})" if exit_code == -signal.SIGKILL else "")
    elif exit_code == 0:
        note = "the harness exited 0 without writing a summary"
    else:
        note = f"exit code {exit_code}"
    return f"{tail}\n[matrun] {note}".lstrip("\n")


def refused_outcome(run_dir: Path, reason: str, started: datetime) -> RunOutcome:
    """A cell the executor cannot run: failed, nothing started, the reason as its error."""
    for name in (STDOUT, STDERR):
        (run_dir / name).touch()
    now = datetime.now(timezone.utc).isoformat()
    return RunOutcome(status="failed", exit_code=None, error_tail=f"[matrun] {reason}",
                      started_at=started.isoformat(), ended_at=now, wall_seconds=0.0)


def cancelled_outcome() -> RunOutcome:
    """The run the sweep was running when it was interrupted (Ctrl-C, SIGTERM)."""
    now = datetime.now(timezone.utc).isoformat()
    return RunOutcome(status="cancelled", exit_code=None, error_tail="[matrun] the sweep was interrupted",
                      started_at=now, ended_at=now, wall_seconds=0.0)


class RunAborted(MatrunError):
    """The executor cannot run anything more (the Docker engine stopped answering mid-cell and
    did not come back): ``outcome`` is how the run ended (failed, with the reason); the sweep
    records it, then stops with this error (``Error: …``, exit 1) instead of failing every
    following cell the same way."""

    def __init__(self, message: str, outcome: RunOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome
