"""What ``matrun sweep`` shows while it runs (docs/CLI.md "matrun sweep"), on stderr.

On a terminal, one live line at the bottom, redrawn as the run goes: the runs ended out of
all, a bar, the time left, and the run going now (its cell, repeat, seconds so far, label),
cut to the terminal's width; the line per ended run is printed above it.  Elsewhere (piped,
a log file) nothing is redrawn: each run gets a plain line as it starts, ``run 18 of 48:
cell … repeat 3 (label); about 3m10s left`` (Slurm's, which start in parallel: ``started cell
… repeat 3 (label); 17 of 48 ended``), and its ended line.  The counts and estimates
come from ``runner/sweep/progress.py``.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.table import Column
from rich.text import Text

from matrun.runner.cli.common import duration_text
from matrun.runner.sweep.progress import SweepProgress
from matrun.warehouse.bundles.layout import CANARY_REPEAT

#: Characters of the live line's bar.
BAR_WIDTH = 20
#: Characters of a cell id on the live line.
SHORT_ID = 8


def repeat_text(repeat: int, prefix: str = "repeat ") -> str:
    """A run's repeat as the sweep's output shows it; a drift canary's run says so."""
    return "canary" if repeat == CANARY_REPEAT else f"{prefix}{repeat}"


def left_text(seconds: float | None) -> str:
    """``about 3m10s left``, or ``time left unknown``."""
    return "time left unknown" if seconds is None else f"about {duration_text(seconds)} left"


class SweepDisplay:
    """Turns the sweep's events into its output on ``console`` (stderr): call it with each
    ``SweepEvent``; :meth:`stop` ends the live line.  ``clock``: seconds, for the time a run
    has been going (``time.monotonic``)."""

    def __init__(self, console: Console, *, clock: Any = time.monotonic) -> None:
        self.console = console
        self.live = console.is_terminal
        self.clock = clock
        self.progress: SweepProgress | None = None
        self.started_at: float | None = None  # when the current run began (clock)
        self.running: tuple[str, str] | None = None  # the current run: "cell … repeat N", its label
        self._bar = Progress(_Line(self), console=console, disable=not self.live, expand=True)
        self._task: Any = None

    def __call__(self, event: Any) -> None:
        handler = getattr(self, "_" + event.kind.replace("-", "_"), None)
        if handler is not None:
            handler(event)

    def stop(self) -> None:
        self._bar.stop()

    # -- the events ------------------------------------------------------------------------

    def _message(self, event: Any) -> None:
        typer.echo(event.text, err=True)

    def _plan(self, event: Any) -> None:
        note = f" (estimated {duration_text(event.estimate_s)})" if event.estimate_s else ""
        typer.echo(f"{event.text}{note}", err=True)
        self.progress = SweepProgress(total=event.total, expected=event.expected, estimate_s=event.estimate_s)
        self._task = self._bar.add_task("sweep", total=event.total)
        if self.live:
            self._bar.start()

    def _run_start(self, event: Any) -> None:
        if self.progress is None:
            return
        self.progress.started(event.cell.cell_id)
        self.started_at = self.clock()
        run = f"cell {event.cell.cell_id} {repeat_text(event.repeat)}"
        # the live line: the id's first 8 characters (as --where cell= takes it), room for the label
        self.running = (f"cell {event.cell.cell_id[:SHORT_ID]} {repeat_text(event.repeat)}", event.cell.cell.label)
        if not self.live:
            label = f" ({event.cell.cell.label})" if event.cell.cell.label else ""
            done, total = self.progress.done, self.progress.total
            if self.progress.expected is None:  # Slurm: runs start in parallel, no estimate
                typer.echo(f"started {run}{label}; {done} of {total} ended", err=True)
            else:
                typer.echo(f"run {done + 1} of {total}: {run}{label}; {left_text(self.progress.left())}", err=True)
        self._bar.refresh()

    def _run_again(self, event: Any) -> None:
        """The run that just ended started busy: its repeat runs once more ([sweep] rerun_busy)."""
        self._print(event.text)
        if self.progress is not None:
            self.progress.added(event.cell.cell_id)
        if self._task is not None:
            self._bar.update(self._task, total=self.progress.total if self.progress else None)

    def _adaptive(self, event: Any) -> None:
        """A round of adaptive repeats: ``event.total`` more runs, of the cells in ``expected``."""
        self._print(event.text)
        if self.progress is not None:
            self.progress.total += event.total
            if self.progress.estimate_s is not None and self.progress.expected:
                self.progress.estimate_s += sum(self.progress.expected.get(c, 0.0) for c in (event.expected or {}))
        if self._task is not None:
            self._bar.update(self._task, total=self.progress.total if self.progress else None)

    def _run_skip(self, event: Any) -> None:
        self._ended(event.cell.cell_id, None)
        self._print(f"{'done':>9}  {event.cell.cell_id}  {repeat_text(event.repeat)}  ({event.text})  "
                    f"{event.cell.cell.label}")

    def _run_end(self, event: Any) -> None:
        outcome = event.outcome
        self._ended(event.cell.cell_id, outcome.wall_seconds)
        self._print(f"{outcome.status:>9}  {event.cell.cell_id}  {repeat_text(event.repeat)}  "
                    f"{outcome.wall_seconds:7.1f}s  {event.cell.cell.label}")

    def _ended(self, cell_id: str, wall_seconds: float | None) -> None:
        if self.progress is not None:
            self.progress.ended(cell_id, wall_seconds)
            if self.progress.current is None:
                self.running, self.started_at = None, None
        if self._task is not None:
            self._bar.advance(self._task)

    def _print(self, line: str) -> None:
        self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)

    # -- what the live line shows ---------------------------------------------------------

    def counts_text(self) -> str:
        """``17 of 48``."""
        return "" if self.progress is None else f"{self.progress.done} of {self.progress.total}"

    def status_text(self) -> str:
        """``about 3m10s left · cell 1d24ab8c repeat 3, 0m42s: framework=torch threads=2``."""
        if self.progress is None:
            return ""
        if self.progress.done >= self.progress.total and self.running is None:
            return "all ended"
        running_s = self.clock() - self.started_at if self.started_at is not None else 0.0
        text = left_text(self.progress.left(running_s))
        if self.running is not None:
            run, label = self.running
            text += f" · {run}, {duration_text(running_s)}" + (f": {label}" if label else "")
        return text


class _Line(ProgressColumn):
    """The whole live line as one text, cut with an ellipsis at the terminal's width: the
    counts, a bar, the time left and the run going now."""

    def __init__(self, display: SweepDisplay) -> None:
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1))
        self.display = display

    def render(self, task: Task) -> Text:
        display = self.display
        line = Text(no_wrap=True, overflow="ellipsis")
        if display.progress is None:
            return line
        done, total = display.progress.done, display.progress.total
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        line.append(f"{display.counts_text()} ")
        line.append("━" * filled, style="bar.finished" if done >= total else "bar.complete")
        line.append("━" * (BAR_WIDTH - filled), style="bar.back")
        line.append(f" {display.status_text()}")
        return line
