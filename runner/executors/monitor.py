"""Host-side sampling of a cell's process tree: CPU user/system, host iowait, RSS.

The monitor runs in a thread of the host launcher, outside the cell, so the cell's own
timing never includes it.  It is built to be cheap (the benchmark in
benchmarks/monitor_cost.py measures it): known processes are sampled every tick from
/proc through psutil; the process tree is rescanned for new children only once a second.
Samples are appended to ``monitor.jsonl`` as they come (flushed each second), so a crash
of the host still leaves what was seen.  ``Totals`` (the running sums behind the aggregates in
result.json) and ``iowait_percent`` are shared with the cgroup monitor (``monitor_cgroup.py``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import psutil

from matrun.warehouse.bundles.layout import SCHEMA_VERSION

DEFAULT_INTERVAL_S = 0.2
RESCAN_EVERY_S = 1.0


@dataclass
class Totals:
    """Running sums of a monitor's samples (this process monitor's and the cgroup monitor's)."""

    samples: int = 0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    iowait: float = 0.0
    rss: float = 0.0
    rss_peak: int = 0

    def add(self, user: float, system: float, iowait: float, rss: int) -> None:
        """One sample into the sums."""
        self.samples += 1
        self.cpu_user += user
        self.cpu_system += system
        self.iowait += iowait
        self.rss += rss
        self.rss_peak = max(self.rss_peak, rss)

    def aggregates(self, interval_s: float) -> dict[str, Any]:
        """The aggregates that go into result.json (None for each average without samples)."""
        n = self.samples
        avg = (lambda x: x / n) if n else (lambda x: None)
        user, system = avg(self.cpu_user), avg(self.cpu_system)
        return {
            "interval_s": interval_s,
            "samples": n,
            "cpu_user_avg": user,
            "cpu_system_avg": system,
            "cpu_total_avg": (user + system) if n else None,
            "iowait_avg": avg(self.iowait),
            "rss_avg_bytes": avg(self.rss),
            "rss_peak_bytes": self.rss_peak if n else None,
        }


class SampleFile:
    """``monitor.jsonl`` opened for the sampling thread, which must never die of a full or
    failing disk: the first ``OSError`` (opening, writing, flushing or closing) stops the
    writing and is kept in ``error``; the thread goes on sampling, so the run's aggregates
    (``Totals``) are still returned and the cell is never disturbed by its monitor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: OSError | None = None
        self._out: TextIO | None = None

    def __enter__(self) -> "SampleFile":
        try:
            self._out = open(self.path, "w", encoding="utf-8")
        except OSError as exc:
            self.error = exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        out, self._out = self._out, None
        if out is not None:
            try:
                out.close()
            except OSError as exc:
                self.error = self.error or exc

    def write(self, text: str) -> None:
        self._do(lambda out: out.write(text))

    def flush(self) -> None:
        self._do(lambda out: out.flush())

    def _do(self, action: Callable[[TextIO], object]) -> None:
        if self._out is None or self.error is not None:
            return
        try:
            action(self._out)
        except OSError as exc:
            self.error = exc


@dataclass
class Monitor:
    """Sample the tree rooted at ``pid`` every ``interval_s`` until ``stop()``."""

    pid: int
    path: Path
    interval_s: float = DEFAULT_INTERVAL_S
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _totals: Totals = field(default_factory=Totals, init=False)
    _procs: dict[int, psutil.Process] = field(default_factory=dict, init=False)
    _last_cpu: dict[int, tuple[float, float]] = field(default_factory=dict, init=False)

    def start(self) -> "Monitor":
        self._thread = threading.Thread(target=self._run, name=f"monitor-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling and return the aggregates that go into result.json."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self._totals.aggregates(self.interval_s)

    def _run(self) -> None:
        with SampleFile(self.path) as out:
            out.write(json.dumps({"type": "header", "schema_version": SCHEMA_VERSION,
                                  "interval_s": self.interval_s, "pid": self.pid}) + "\n")
            try:
                self._loop(out)
            finally:
                out.flush()

    def _loop(self, out: "SampleFile") -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        self._procs = {self.pid: root}
        start = time.monotonic()
        last_t = start
        last_cpu_host = psutil.cpu_times()
        last_scan = last_flush = 0.0
        self._prime()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - last_scan >= RESCAN_EVERY_S:
                self._rescan(root)
                last_scan = now
            dt = now - last_t
            last_t = now
            user, system, rss, alive = self._sample_tree(dt)
            if not alive:
                break
            host = psutil.cpu_times()
            iowait = iowait_percent(last_cpu_host, host)
            last_cpu_host = host
            self._record(out, now - start, user, system, iowait, rss, alive)
            if now - last_flush >= 1.0:
                out.flush()
                last_flush = now

    def _prime(self) -> None:
        for pid, proc in list(self._procs.items()):
            try:
                ct = proc.cpu_times()
                self._last_cpu[pid] = (ct.user, ct.system)
            except psutil.Error:
                self._procs.pop(pid, None)

    def _rescan(self, root: psutil.Process) -> None:
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if child.pid not in self._procs:
                self._procs[child.pid] = child
                self._last_cpu[child.pid] = (0.0, 0.0)  # its CPU since birth counts

    def _sample_tree(self, dt: float) -> tuple[float, float, int, int]:
        user = system = 0.0
        rss = alive = 0
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    ct = proc.cpu_times()
                    mem = proc.memory_info().rss
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        raise psutil.NoSuchProcess(pid)
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            u, s = ct.user, ct.system  # children are sampled themselves: no double count
            lu, ls = self._last_cpu.get(pid, (u, s))
            self._last_cpu[pid] = (u, s)
            user += max(0.0, u - lu)
            system += max(0.0, s - ls)
            rss += mem
            alive += 1
        scale = 100.0 / dt if dt > 0 else 0.0
        return user * scale, system * scale, rss, alive

    def _record(self, out: "SampleFile", t: float, user: float, system: float, iowait: float,
                rss: int, nprocs: int) -> None:
        out.write(json.dumps({"t": round(t, 3), "cpu_user": round(user, 2), "cpu_system": round(system, 2),
                              "iowait": round(iowait, 2), "rss_bytes": rss, "nprocs": nprocs}) + "\n")
        self._totals.add(user, system, iowait, rss)


def iowait_percent(before: Any, after: Any) -> float:
    """The host's iowait between two ``psutil.cpu_times()``, in percent of all CPU time."""
    total = sum(after) - sum(before)
    if total <= 0:
        return 0.0
    return 100.0 * (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0)) / total
