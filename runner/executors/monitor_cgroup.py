"""Host-side sampling of a container's cgroup: CPU user/system, host iowait, memory.

The Docker executor's twin of ``runner/executors/monitor.py``: same 5 Hz thread, same
``monitor.jsonl`` record format and the same aggregates, but it reads the container's
cgroup files instead of walking a process tree (a container's processes live in another
PID namespace, and the cgroup already sums them).  The files vanish when the container
exits (and empty a moment before: no process left in ``cgroup.procs``), so the last sample
is the last one read while a process of the container still ran.

Both cgroup layouts are handled (``find_cgroup``):

- v1 (this host: ``Cgroup Version: 1``, driver cgroupfs): one directory per controller,
  ``/sys/fs/cgroup/cpuacct/docker/<id>/cpuacct.usage_user`` / ``cpuacct.usage_sys``
  (nanoseconds), ``/sys/fs/cgroup/memory/docker/<id>/memory.usage_in_bytes``,
  ``memory.max_usage_in_bytes``, ``memory.stat`` (``total_inactive_file``).
- v2 (unified): one directory (``/sys/fs/cgroup/docker/<id>`` with cgroupfs,
  ``/sys/fs/cgroup/system.slice/docker-<id>.scope`` with systemd): ``cpu.stat``
  (``user_usec`` / ``system_usec``), ``memory.current``, ``memory.peak`` where the kernel
  has it, ``memory.stat`` (``inactive_file``).

``rss_bytes`` is the cgroup's memory usage minus its inactive file cache (what
``docker stats`` shows): close to the summed RSS the process monitor reports, and what the
memory limit is compared with.  ``nprocs`` counts the cgroup's processes.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from matrun.warehouse.bundles.layout import SCHEMA_VERSION
from matrun.runner.executors.monitor import DEFAULT_INTERVAL_S, SampleFile, Totals, iowait_percent

CGROUP_ROOT = Path("/sys/fs/cgroup")
FIND_TIMEOUT_S = 2.0  # the cgroup appears as the container starts; wait this long for it


@dataclass(frozen=True)
class CgroupPaths:
    """Where one container's statistics are: ``cpu`` and ``memory`` directories (equal on v2)."""

    version: int
    cpu: Path
    memory: Path


def cgroup_version(root: Path = CGROUP_ROOT) -> int:
    return 2 if (root / "cgroup.controllers").exists() else 1


def _find_dir(base: Path, container_id: str, depth: int = 4) -> Path | None:
    """The directory under ``base`` named for the container (``<id>`` or ``docker-<id>.scope``)."""
    names = (container_id, f"docker-{container_id}.scope")
    for name in names:  # the usual places first: no walk
        for parent in (base / "docker", base / "system.slice", base):
            if (parent / name).is_dir():
                return parent / name
    level = [base]
    for _ in range(depth):  # a custom cgroup parent: a shallow breadth-first walk
        nxt = []
        for d in level:
            try:
                children = [c for c in d.iterdir() if c.is_dir()]
            except OSError:
                continue
            for c in children:
                if c.name in names:
                    return c
            nxt.extend(children)
        level = nxt
    return None


def find_cgroup(container_id: str, root: Path = CGROUP_ROOT) -> CgroupPaths | None:
    """The cgroup directories of a running container (its full 64-hex id), or None."""
    if cgroup_version(root) == 2:
        found = _find_dir(root, container_id)
        return CgroupPaths(2, found, found) if found else None
    cpu = _find_dir(root / "cpuacct", container_id) or _find_dir(root / "cpu,cpuacct", container_id)
    memory = _find_dir(root / "memory", container_id)
    return CgroupPaths(1, cpu, memory) if cpu and memory else None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def read_cpu_seconds(paths: CgroupPaths) -> tuple[float, float] | None:
    """Cumulative (user, system) CPU seconds of the cgroup, or None once it is gone."""
    if paths.version == 2:
        stat = _read_keyed(paths.cpu / "cpu.stat")
        if "user_usec" not in stat:
            return None
        return stat["user_usec"] / 1e6, stat["system_usec"] / 1e6
    user, system = _read_int(paths.cpu / "cpuacct.usage_user"), _read_int(paths.cpu / "cpuacct.usage_sys")
    if user is None or system is None:
        return None
    return user / 1e9, system / 1e9


def read_memory(paths: CgroupPaths) -> tuple[int, int, int | None] | None:
    """(usage minus inactive file cache, raw usage, peak usage or None), or None once gone."""
    if paths.version == 2:
        usage = _read_int(paths.memory / "memory.current")
        peak = _read_int(paths.memory / "memory.peak")
        inactive = _read_keyed(paths.memory / "memory.stat").get("inactive_file", 0)
    else:
        usage = _read_int(paths.memory / "memory.usage_in_bytes")
        peak = _read_int(paths.memory / "memory.max_usage_in_bytes")
        inactive = _read_keyed(paths.memory / "memory.stat").get("total_inactive_file", 0)
    if usage is None:
        return None
    return max(0, usage - inactive), usage, peak


def count_procs(paths: CgroupPaths) -> int:
    try:
        return sum(1 for line in (paths.cpu / "cgroup.procs").read_text().splitlines() if line.strip())
    except OSError:
        return 0


@dataclass
class CgroupMonitor:
    """Sample the cgroup of container ``container_id`` every ``interval_s`` until ``stop()``.

    ``pid`` (the container's first process as the host sees it) only goes into the header.
    """

    container_id: str
    path: Path
    pid: int | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    root: Path = CGROUP_ROOT
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _totals: Totals = field(default_factory=Totals, init=False)
    _usage_peak: int = field(default=0, init=False)
    _cgroup_peak: int | None = field(default=None, init=False)
    cgroup: CgroupPaths | None = field(default=None, init=False)

    def start(self) -> "CgroupMonitor":
        self._thread = threading.Thread(target=self._run, name=f"cgroup-monitor-{self.container_id[:12]}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling and return the aggregates (``runner/executors/monitor.py``'s keys, plus the
        cgroup's own peak usage where it keeps one)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        n = self._totals.samples
        return {
            **self._totals.aggregates(self.interval_s),
            "cgroup_memory_peak_bytes": self._cgroup_peak if self._cgroup_peak is not None
            else (self._usage_peak if n else None),
            "source": f"cgroup v{self.cgroup.version}" if self.cgroup else "cgroup (not found)",
        }

    def _run(self) -> None:
        deadline = time.monotonic() + FIND_TIMEOUT_S
        while self.cgroup is None and not self._stop.is_set():
            self.cgroup = find_cgroup(self.container_id, self.root)
            if self.cgroup is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        with SampleFile(self.path) as out:
            out.write(json.dumps({
                "type": "header", "schema_version": SCHEMA_VERSION, "interval_s": self.interval_s,
                "pid": self.pid, "container": self.container_id,
                "cgroup": str(self.cgroup.memory) if self.cgroup else None}) + "\n")
            try:
                if self.cgroup is not None:
                    self._loop(out, self.cgroup)
            finally:
                out.flush()

    def _loop(self, out: SampleFile, paths: CgroupPaths) -> None:
        start = last_t = time.monotonic()
        last_cpu = read_cpu_seconds(paths)
        if last_cpu is None:
            return
        last_host = psutil.cpu_times()
        last_flush = start
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            cpu = read_cpu_seconds(paths)
            memory = read_memory(paths)
            if cpu is None or memory is None:  # the container exited: its cgroup is gone
                break
            nprocs = count_procs(paths)
            if nprocs == 0:  # its processes are gone, the cgroup not yet: not a sample of the run
                break
            dt = now - last_t
            scale = 100.0 / dt if dt > 0 else 0.0
            user = max(0.0, cpu[0] - last_cpu[0]) * scale
            system = max(0.0, cpu[1] - last_cpu[1]) * scale
            last_cpu, last_t = cpu, now
            host = psutil.cpu_times()
            iowait = iowait_percent(last_host, host)
            last_host = host
            working, usage, peak = memory
            self._usage_peak = max(self._usage_peak, usage)
            if peak is not None:
                self._cgroup_peak = peak
            self._record(out, now - start, user, system, iowait, working, usage, nprocs)
            if now - last_flush >= 1.0:
                out.flush()
                last_flush = now

    def _record(self, out: SampleFile, t: float, user: float, system: float, iowait: float,
                rss: int, usage: int, nprocs: int) -> None:
        out.write(json.dumps({"t": round(t, 3), "cpu_user": round(user, 2), "cpu_system": round(system, 2),
                              "iowait": round(iowait, 2), "rss_bytes": rss, "nprocs": nprocs,
                              "mem_usage_bytes": usage}) + "\n")
        self._totals.add(user, system, iowait, rss)
