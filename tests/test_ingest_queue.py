"""The synchronous sweep's ingest spacing (runner/sweep/records.py ``IngestQueue``): a finished
run is ingested at once unless the last ingest ended less than INGEST_SPACING times its own
duration ago; then it waits for the next ingest, which takes every waiting run together.  The
clock and the ingest are fakes here (the ingest advances the clock by its cost), so each case
is exact; the real sweeps of tests/test_sweep.py and tests/test_docker_sweep.py ingest through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrun.runner.sweep.records import INGEST_SPACING, IngestQueue, SweepSummary

assert INGEST_SPACING == 10.0  # the cases below are written for it


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Warehouse:
    """A fake ingest: records each call's runs and takes ``cost`` seconds of the fake clock."""

    def __init__(self, clock: Clock, cost: float = 2.5, fail_on: int | None = None) -> None:
        self.clock, self.cost, self.fail_on = clock, cost, fail_on
        self.calls: list[list[str]] = []

    def __call__(self, paths: list[Path], warehouse: Path, summary: SweepSummary) -> None:
        self.calls.append([p.name for p in paths])
        self.clock.now += self.cost
        if self.fail_on == len(self.calls):
            raise KeyboardInterrupt  # interrupted mid-ingest


def queue_with(cost: float = 2.5, fail_on: int | None = None) -> tuple[IngestQueue, Clock, Warehouse]:
    clock = Clock()
    wh = Warehouse(clock, cost, fail_on)
    return IngestQueue(Path("w.duckdb"), SweepSummary(sweep="s", executor="local"), clock=clock, ingest=wh), clock, wh


def test_short_runs_wait_and_go_in_together_and_the_last_ones_on_flush():
    queue, clock, wh = queue_with(cost=2.5)  # an ingest: 2.5 s; the next one 25 s after it ended
    for n in range(12):  # runs of 5 s each
        clock.now += 5.0
        queue.add(Path(f"run{n}"))
    # run0 at once (no ingest yet); run1-4 wait (5-20 s after it); run5 25 s after: run1-5 together
    assert wh.calls[:2] == [["run0"], ["run1", "run2", "run3", "run4", "run5"]]
    assert wh.calls[2] == ["run6", "run7", "run8", "run9", "run10"]
    assert queue.waiting == [Path("run11")]
    queue.flush()
    assert wh.calls[3] == ["run11"] and queue.waiting == [] and queue.ingests == 4
    queue.flush()  # nothing waits: no ingest
    assert len(wh.calls) == 4
    assert sorted(name for call in wh.calls for name in call) == sorted(f"run{n}" for n in range(12))


def test_runs_longer_than_ten_ingests_are_each_ingested_as_they_end():
    queue, clock, wh = queue_with(cost=2.5)
    for n in range(4):
        clock.now += 25.0  # exactly ten ingests since the last one ended
        queue.add(Path(f"run{n}"))
    assert wh.calls == [["run0"], ["run1"], ["run2"], ["run3"]] and queue.waiting == []


def test_the_spacing_follows_the_last_ingests_own_cost():
    queue, clock, wh = queue_with(cost=0.3)  # a small warehouse: 3 s apart
    clock.now += 1.0
    queue.add(Path("a"))
    clock.now += 2.0
    queue.add(Path("b"))  # 2 s < 3 s: waits
    assert wh.calls == [["a"]]
    wh.cost = 4.0
    clock.now += 1.0
    queue.add(Path("c"))  # 3 s after: b and c, an ingest of 4 s
    assert wh.calls == [["a"], ["b", "c"]]
    clock.now += 39.0
    queue.add(Path("d"))  # 39 s < 40 s
    clock.now += 1.0
    queue.add(Path("e"))
    assert wh.calls[-1] == ["d", "e"]


def test_an_interrupted_ingest_leaves_no_run_waiting_twice():
    """Ctrl-C inside an ingest: those runs are on disk (the next sweep's catch-up takes them);
    the queue does not hand them to a later ingest again, and it keeps spacing."""
    queue, clock, wh = queue_with(cost=2.5, fail_on=1)
    clock.now += 5.0
    with pytest.raises(KeyboardInterrupt):
        queue.add(Path("run0"))
    assert queue.waiting == [] and queue.ingests == 1
    clock.now += 5.0
    queue.add(Path("run1"))  # 5 s after an ingest of 2.5 s: waits
    assert wh.calls == [["run0"]] and queue.waiting == [Path("run1")]
