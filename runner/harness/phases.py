"""Phase timing of sampled training steps, and the all-reduce calibration fit (docs/MODEL.md).

Every ``every``-th timed step is *sampled*: the adapter reads the clock at the end of each
phase it can separate (``PHASES``) and, on a GPU, waits for the device before each reading,
so a phase's time is its own and not the next one's queue.  The sampled steps are recorded
with ``phase = "sampled"`` and kept out of the throughput (``EventLog.rated``): the waits
change their timing, never the others'.  A phase the framework runs fused with another (one
compiled program, e.g. a jitted step) is recorded under the names joined by ``+``
(``"forward+backward+update"``), never split by guesswork.

Hot path: an unsampled step costs one integer comparison (``EventLog.phase_clock`` returns
None).  Standard library only, like the rest of the harness.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

#: The phases of one SGD iteration, in order (study C's model): the batch fetched or built,
#: copied to the device, the forward pass (loss included), the backward pass, the gradient
#: exchange of a multi-worker step, the optimizer's update.
PHASES = ("input", "h2d", "forward", "backward", "exchange", "update")
#: Sample every this-many-th timed step by default (``phase_sampling``): MXNet's sampled step
#: costs about 17 % more than its others (its asynchronous engine waited for at each phase,
#: benchmarks/phase_sampling.py), 1 in 20 keeps that under 1 % of a run's wall time.
DEFAULT_EVERY = 20
#: Message sizes of the all-reduce calibration, bytes (fp32 elements x 4).
CALIBRATION_BYTES = (4 * 1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024)
CALIBRATION_ROUNDS = 5


def known(name: str) -> bool:
    """Whether ``name`` is a phase or phases joined by ``+``, in ``PHASES`` order, no repeats."""
    parts = name.split("+")
    if not parts or any(p not in PHASES for p in parts):
        return False
    order = [PHASES.index(p) for p in parts]
    return order == sorted(set(order))


class StepClock:
    """The clock of one sampled step: ``mark(name)`` after each phase (``sync`` first, when
    given: the device wait), ``end()`` when the step is recorded."""

    __slots__ = ("index", "times", "_sync", "_last", "_sink")

    def __init__(self, index: int, sync: Callable[[], Any] | None, sink: list[tuple[int, tuple[tuple[str, float], ...]]]):
        self.index = index
        self.times: list[tuple[str, float]] = []
        self._sync = sync
        self._sink = sink
        self._last = time.perf_counter()

    def start(self) -> None:
        """Restart the clock: the step's first phase begins now (call it where the step's own
        clock starts, ``t0``)."""
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        """Phase ``name`` ends now (after the device wait)."""
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        self.times.append((name, now - self._last))
        self._last = now

    def end(self) -> None:
        """Keep this step's phases (call it after the step's tuple is recorded)."""
        self._sink.append((self.index, tuple(self.times)))


class Sampler:
    """Which steps are sampled: timed step ``k`` (0-based after the warm-up) when
    ``k % every == every - 1``; none when ``every`` is 0."""

    def __init__(self, every: int, warmup_steps: int) -> None:
        self.every = every
        self.warmup_steps = warmup_steps

    def sampled(self, index: int) -> bool:
        k = index - self.warmup_steps
        return bool(self.every) and k >= 0 and k % self.every == self.every - 1


def summary(every: int, kept: Sequence[tuple[int, tuple[tuple[str, float], ...]]],
            step_seconds: dict[int, float], unsampled_seconds: Iterable[float]) -> dict[str, Any]:
    """The ``phases`` field of the run's summary: per phase name the median over the sampled
    steps, their step's median, the median of the timed steps that were not sampled, and the
    median gap (step - sum of its phases: time no phase accounts for)."""
    by_name: dict[str, list[float]] = {}
    order: list[str] = []
    gaps, totals = [], []
    for index, times in kept:
        for name, seconds in times:
            if name not in by_name:
                by_name[name] = []
                order.append(name)
            by_name[name].append(seconds)
        if index in step_seconds:
            totals.append(step_seconds[index])
            gaps.append(step_seconds[index] - sum(s for _, s in times))
    unsampled = list(unsampled_seconds)
    return {
        "every": every,
        "sampled_steps": len(kept),
        "order": order,
        "fused": [name for name in order if "+" in name],
        "median": {name: statistics.median(values) for name, values in by_name.items()},
        "step_seconds_median": statistics.median(totals) if totals else None,
        "unsampled_step_seconds_median": statistics.median(unsampled) if unsampled else None,
        "gap_seconds_median": statistics.median(gaps) if gaps else None,
    }


def fit(points: Sequence[tuple[int, float]]) -> tuple[float | None, float | None]:
    """(latency s, bandwidth bytes/s) of ``seconds = latency + bytes / bandwidth`` by least
    squares over (bytes, seconds) points; None where the fit is meaningless (fewer than two
    sizes, a slope <= 0).  A negative intercept is clamped to 0."""
    if len({b for b, _ in points}) < 2:
        return None, None
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(s for _, s in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    sxy = sum((b - mx) * (s - my) for b, s in points)
    slope = sxy / sxx if sxx else 0.0
    if not slope > 0 or not math.isfinite(slope):
        return None, None
    return max(my - slope * mx, 0.0), 1.0 / slope


def calibration(points: Sequence[tuple[int, float]], *, pattern: str, transport: str, workers: int,
                overlaps_backward: bool) -> dict[str, Any]:
    """The ``calibration`` entry of a multi-worker cell's ``exchange`` summary: the measured
    (bytes, median seconds) points of the framework's own all-reduce among the cell's workers,
    their fit, and what the model needs to know of the exchange (docs/MODEL.md)."""
    latency, bandwidth = fit(points)
    return {"points": [[int(b), float(s)] for b, s in points], "latency_s": latency,
            "bandwidth_bytes_per_s": bandwidth, "pattern": pattern, "transport": transport,
            "workers": workers, "overlaps_backward": overlaps_backward}


def time_collective(run: Callable[[int], Callable[[], Any]], *, sizes: Sequence[int] = CALIBRATION_BYTES,
                    rounds: int = CALIBRATION_ROUNDS, barrier: Callable[[], Any] | None = None
                    ) -> list[tuple[int, float]]:
    """(bytes, median seconds) per size: ``run(bytes)`` prepares a buffer of that many bytes
    and returns the call that all-reduces it (and waits for it); one untimed call first, then
    ``rounds`` timed ones, each after ``barrier`` (untimed) when given."""
    points = []
    for size in sizes:
        call = run(size)
        call()
        times = []
        for _ in range(rounds):
            if barrier is not None:
                barrier()
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        points.append((size, statistics.median(times)))
    return points
