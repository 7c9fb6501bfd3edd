"""``events.jsonl``: the harness's record of one run (docs/BUNDLE.md), and its summary.

The file starts with a header line (``schema_version`` 1), then one JSON object a line.
Steps are the hot path: an adapter appends one tuple per optimizer step to ``log.steps``
(nothing else: no I/O, no dict, no formatting while it trains) and the tuples are written
when the epoch's record is written, just before it.  The file is flushed after every
record that is not a step (a handful per epoch) and when the log is closed, so a crash
loses at most the current epoch's steps.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterable

from . import phases as phase_timing

SCHEMA_VERSION = 1

# One optimizer step as an adapter records it: (epoch, perf_counter at start, perf_counter
# at end, images in the batch).  The global step number is the tuple's index in the list.
StepSample = tuple[int, float, float, int]


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def inside_steps(times: Iterable[float], steps: list[StepSample]) -> int:
    """How many of ``times`` fell inside a step, between its start and end (the steps in
    order and apart, as an adapter records them)."""
    starts = [t0 for _, t0, _, _ in steps]
    count = 0
    for t in times:
        index = bisect.bisect_right(starts, t) - 1
        if index >= 0 and t <= steps[index][2]:
            count += 1
    return count


class EventLog:
    """Writes ``events.jsonl`` and keeps what the summary is computed from.

    ``warmup_steps``: the first that many steps of the run (not of each epoch) are
    ``warmup``, the rest ``timed``.  ``started``: ``time.perf_counter()`` when the harness
    started, the origin of ``time_to_first_step``.  ``phase_every``: sample the phases of
    every that-many-th timed step (``phase_clock``; 0: none, docs/MODEL.md).
    """

    def __init__(self, path: Path, *, warmup_steps: int, started: float, harness_version: str,
                 phase_every: int = 0) -> None:
        self.path = Path(path)
        self.steps: list[StepSample] = []
        self.epochs: list[dict[str, Any]] = []
        self.warmup_steps = warmup_steps
        self.started = started
        self.sampler = phase_timing.Sampler(phase_every, warmup_steps)
        # (step index, ((phase, seconds), ...)) of each sampled step, in step order
        self.phases: list[tuple[int, tuple[tuple[str, float], ...]]] = []
        self._sampled: set[int] = set()
        self._phases_written = 0
        self._steps_written = 0
        self.model: dict[str, Any] | None = None  # the adapter's ``model`` record, once emitted
        self._file = open(self.path, "w", encoding="utf-8")
        self.emit("header", schema_version=SCHEMA_VERSION, harness_version=harness_version, t=time.time())

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Write the steps not written yet and close the file (safe to call twice)."""
        if not self._file.closed:
            self.write_steps()
            self._file.close()

    def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Write one record now and flush; NaN and infinities become null."""
        record = finite({"type": type_, **fields})
        if type_ == "model":
            self.model = record
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        return record

    def phase_clock(self, sync: Callable[[], Any] | None = None) -> phase_timing.StepClock | None:
        """The phase clock of the step about to be recorded (index ``len(self.steps)``) when it
        is sampled, else None (the hot path: one comparison).  ``sync``: the device wait the
        clock calls before each reading (None on the CPU).  The adapter calls ``start()`` at
        the step's ``t0``, ``mark(phase)`` after each phase and ``end()`` after recording the
        step."""
        index = len(self.steps)
        if not self.sampler.sampled(index):
            return None
        return phase_timing.StepClock(index, sync, self.phases)

    def _sync_sampled(self) -> None:
        for index, _ in self.phases[len(self._sampled):]:
            self._sampled.add(index)

    def rated(self) -> list[StepSample]:
        """The steps the throughput is the median of: the timed ones not sampled for phases
        (all the unsampled steps when none is timed)."""
        self._sync_sampled()
        timed = [s for i, s in enumerate(self.steps) if i >= self.warmup_steps and i not in self._sampled]
        return timed or [s for i, s in enumerate(self.steps) if i not in self._sampled]

    def unsampled(self) -> list[StepSample]:
        """Every step but the sampled ones, in order (the warm-up first, as in ``steps``)."""
        self._sync_sampled()
        return [s for i, s in enumerate(self.steps) if i not in self._sampled]

    def write_steps(self) -> None:
        """Write the step records buffered since the last call, then the phase records of the
        sampled ones (no flush)."""
        self._sync_sampled()
        lines = []
        for index in range(self._steps_written, len(self.steps)):
            epoch, t_start, t_end, images = self.steps[index]
            phase = "warmup" if index < self.warmup_steps else "sampled" if index in self._sampled else "timed"
            lines.append(json.dumps({"type": "step", "epoch": epoch, "step": index, "phase": phase,
                                     "seconds": t_end - t_start, "images": images}))
        for index, times in self.phases[self._phases_written:]:
            if index < len(self.steps):
                _, t_start, t_end, _ = self.steps[index]
                lines.append(json.dumps(finite({"type": "phases", "step": index, "seconds": t_end - t_start,
                                                "phases": dict(times)}), allow_nan=False))
        if lines:
            self._file.write("\n".join(lines) + "\n")
        self._steps_written = len(self.steps)
        self._phases_written = len(self.phases)

    def epoch(self, *, epoch: int, steps: int, train_loss: float | None, train_accuracy: float | None,
              test_loss: float | None, test_accuracy: float | None, epoch_seconds: float,
              test_seconds: float | None, validation: tuple[float, float, float] | None = None) -> dict[str, Any]:
        """Write the epoch's buffered steps, then its record (which flushes).

        ``validation``: (loss, accuracy, seconds) on the validation split of a cell that holds
        one out (``validation`` > 0), recorded as ``validation_loss``, ``validation_accuracy``
        and ``validation_seconds``; the record has no such keys otherwise."""
        self.write_steps()
        more = {}
        if validation is not None:
            more = dict(zip(("validation_loss", "validation_accuracy", "validation_seconds"), validation))
        record = self.emit("epoch", epoch=epoch, steps=steps, train_loss=train_loss,
                           train_accuracy=train_accuracy, test_loss=test_loss,
                           test_accuracy=test_accuracy, epoch_seconds=epoch_seconds,
                           test_seconds=test_seconds, **more)
        self.epochs.append(record)
        return record

    def best_epoch(self) -> int | None:
        """The epoch with the highest validation accuracy so far (the first of equals), or None
        when no epoch has one."""
        best, best_accuracy = None, None
        for record in self.epochs:
            accuracy = record.get("validation_accuracy")
            if accuracy is not None and (best_accuracy is None or accuracy > best_accuracy):
                best, best_accuracy = record["epoch"], accuracy
        return best

    def should_stop(self, patience: int) -> bool:
        """Early stopping: whether validation accuracy has not improved for ``patience`` epochs
        (the epochs recorded since the best one, ``best_epoch``).  False for ``patience`` 0."""
        best = self.best_epoch()
        if not patience or best is None or not self.epochs:
            return False
        return self.epochs[-1]["epoch"] - best >= patience

    def summary(self, *, diverged: bool, notes: Iterable[str] = (), mode: str = "train",
                inference_seconds: float | None = None,
                peak_device_memory_bytes: int | None = None,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Compute and write the ``summary`` record from the steps and epochs recorded.

        ``mode = "inference"``: there are no epochs; train time, test time and accuracy are
        null and ``inference_seconds`` (the adapter's wall time of all forward batches,
        warm-up included) is given.  ``peak_device_memory_bytes``: the accelerator's peak
        allocation, null on the CPU (the host monitor records the RSS).  ``extra``: more
        fields, written after the computed ones (a multi-worker cell's rank 0 replaces
        ``throughput`` by the aggregate and adds the per-worker numbers, docs/HARNESS.md).
        A training run also gets ``epochs_run`` (epoch records written), ``best_epoch`` (of
        the validation accuracy; null without a validation split) and ``stopped_early``
        (false unless ``extra`` says otherwise).
        """
        notes = list(notes)
        self.write_steps()
        warmup = self.steps[:self.warmup_steps]
        timed = [s for i, s in enumerate(self.steps) if i >= self.warmup_steps and i not in self._sampled]
        rated = timed
        if not timed and self.steps:
            rated = self.rated()
            notes.append(f"no timed steps (all {len(self.steps)} steps are warm-up): "
                         "throughput is the median over all steps, warm-up included")
        last = self.epochs[-1] if self.epochs else {}
        training = mode != "inference"
        fields: dict[str, Any] = {
            "train_seconds": sum(e["epoch_seconds"] for e in self.epochs) if training else None,
            "test_seconds": last.get("test_seconds"),
            "accuracy": None if diverged else last.get("test_accuracy"),
            "throughput": throughput(rated),
            "time_to_first_step": self.steps[0][2] - self.started if self.steps else None,
            "timed_steps": len(timed),
            "warmup_steps": len(warmup),
            "diverged": diverged,
            "inference_seconds": None if training else inference_seconds,
            "peak_device_memory_bytes": peak_device_memory_bytes,
            "images": sum(step[3] for step in self.steps),  # every step's, warm-up included (energy per image)
        }
        if training:
            fields.update(epochs_run=len(self.epochs), best_epoch=self.best_epoch(), stopped_early=False)
            if self.sampler.every:
                step_seconds = {i: self.steps[i][2] - self.steps[i][1] for i, _ in self.phases if i < len(self.steps)}
                fields["phases"] = phase_timing.summary(self.sampler.every, self.phases, step_seconds,
                                                        (t1 - t0 for _, t0, t1, _ in timed))
        if extra:
            fields.update(extra)
        if notes:
            fields["notes"] = notes
        return self.emit("summary", **fields)


def throughput(steps: list[StepSample]) -> float | None:
    """Median over ``steps`` of images/seconds (None for no steps)."""
    rates = [images / max(t_end - t_start, 1e-12) for _, t_start, t_end, images in steps]
    return statistics.median(rates) if rates else None
