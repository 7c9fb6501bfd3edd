"""The machine state that moves benchmark numbers, recorded per run, and the warnings a sweep
gives before it starts.

:func:`machine_state` is taken just before each run starts (the sweep's loop, a Slurm task on its
node) and goes into ``result.json`` as ``host.state``: the CPU frequency governors and boost /
turbo, SMT, the load average, the busiest other processes — over the time since the last run
ended (``LoadWatch``: the sweep's ingest, at least :data:`MIN_WINDOW_S`) or a short window of
its own (:data:`WINDOW_S`) — and the share of the cell's CPUs they used, available memory, the CPU model and
microcode.  ``busy`` flags a run that started on a busy machine (:func:`is_busy`), and
``busy_reasons`` says why.  Each field is None where the kernel does not expose it (this VM has no
cpufreq; a container may hide ``/sys``).

:func:`noise_warnings` is what ``matrun sweep`` and ``matrun doctor`` print before anything runs:
a busy machine, a powersave governor, each with how to fix it.  matrun never changes the host's
settings itself.

Standard library and psutil only: Slurm tasks import this module on every node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Collection, Iterable

import psutil

#: How long the other processes' CPU use is measured when nothing else measures it (a Slurm
#: task, ``matrun doctor``), in seconds.
WINDOW_S = 0.2
#: A sweep measures it over the time between two runs (``LoadWatch``), waiting only when that
#: was shorter than this.
MIN_WINDOW_S = 0.1
#: The container engine's processes: they serve the sweep's own containers (starting, removing
#: them), so their CPU time is not another process's load.
ENGINE = frozenset({"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc",
                    "docker-init", "docker-proxy"})
#: A run starts on a busy machine when other processes used at least this share of the cell's
#: CPUs over the window (0.2 of one CPU on a 2-CPU cell)…
BUSY_SHARE = 0.10
#: …and at least this many CPUs' worth of time in all.
BUSY_MIN_CPUS = 0.2
#: The busiest other processes recorded per run.
TOP_PROCESSES = 5

SYS_CPU = Path("/sys/devices/system/cpu")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def governors(cpus: Iterable[int] | None = None, root: Path = SYS_CPU) -> dict[str, list[int]] | None:
    """Each cpufreq governor in force over ``cpus`` (all when None) and the CPUs it governs; None
    where the kernel exposes no cpufreq (a VM like this one)."""
    wanted = sorted(cpus) if cpus is not None else sorted(range(os.cpu_count() or 1))
    found: dict[str, list[int]] = {}
    for cpu in wanted:
        value = _read(root / f"cpu{cpu}" / "cpufreq" / "scaling_governor")
        if value is not None:
            found.setdefault(value, []).append(cpu)
    return found or None


def boost(root: Path = SYS_CPU) -> bool | None:
    """Whether boost / turbo is on: ``cpufreq/boost`` (acpi-cpufreq, amd-pstate) or
    ``intel_pstate/no_turbo``; None where neither exists."""
    value = _read(root / "cpufreq" / "boost")
    if value in ("0", "1"):
        return value == "1"
    value = _read(root / "intel_pstate" / "no_turbo")
    if value in ("0", "1"):
        return value == "0"
    return None


def smt(root: Path = SYS_CPU) -> dict[str, Any]:
    """SMT (hyper-threading): the kernel's control (on, off, forceoff, notsupported, …) and
    whether it is active."""
    active = _read(root / "smt" / "active")
    return {"control": _read(root / "smt" / "control"),
            "active": (active == "1") if active in ("0", "1") else None}


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str | None]:
    """The CPU model and microcode revision (first processor's)."""
    out: dict[str, str | None] = {"cpu_model": None, "microcode": None}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and out["cpu_model"] is None:
                    out["cpu_model"] = value.strip()
                elif key == "microcode" and out["microcode"] is None:
                    out["microcode"] = value.strip()
                if out["cpu_model"] and out["microcode"]:
                    break
    except OSError:
        pass
    return out


def _own_tree() -> set[int]:
    me = psutil.Process()
    pids = {me.pid}
    try:
        pids.update(child.pid for child in me.children(recursive=True))
    except psutil.Error:
        pass
    return pids


def _cpu_times() -> dict[int, tuple[float, str, frozenset[int] | None]]:
    out = {}
    for proc in psutil.process_iter():
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                name = proc.name()
                try:
                    affinity: frozenset[int] | None = frozenset(proc.cpu_affinity())
                except (psutil.Error, AttributeError, OSError):
                    affinity = None
            out[proc.pid] = (times.user + times.system, name, affinity)
        except psutil.Error:
            continue
    return out


class LoadWatch:
    """Other processes' CPU time since the last look: a sweep restarts it as a run ends and reads
    it as the next one starts, so the window is the time the sweep spends between runs anyway
    (the ingest, the next run's files); only a window shorter than asked is waited out."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self._before = _cpu_times()
        self._t0 = time.monotonic()

    def load(self, cpus: Collection[int] | None, min_window_s: float = MIN_WINDOW_S,
             exclude: Collection[int] = ()) -> dict[str, Any]:
        """What other processes used since the last look (waiting until ``min_window_s`` has
        passed), as :func:`other_load` reports it; the next look starts now."""
        wait = min_window_s - (time.monotonic() - self._t0)
        if wait > 0:
            time.sleep(wait)
        after = _cpu_times()
        elapsed = max(time.monotonic() - self._t0, 1e-6)
        out = _load(self._before, after, elapsed, cpus, _own_tree() | set(exclude))
        self._before, self._t0 = after, time.monotonic()
        return out


def other_load(cpus: Collection[int] | None = None, window_s: float = WINDOW_S,
               exclude: Collection[int] = ()) -> dict[str, Any]:
    """What processes other than this one and its children (and ``exclude``) used over
    ``window_s`` seconds: in CPUs (1.0 = one CPU busy all the window), in all and on ``cpus``
    (processes whose affinity allows one of them), and the busiest of them.  The container
    engine's own processes (:data:`ENGINE`) serve the sweep and are not counted."""
    skip = _own_tree() | set(exclude)
    before = _cpu_times()
    t0 = time.monotonic()
    time.sleep(window_s)
    after = _cpu_times()
    return _load(before, after, max(time.monotonic() - t0, 1e-6), cpus, skip)


def _load(before: dict[int, tuple[float, str, frozenset[int] | None]],
          after: dict[int, tuple[float, str, frozenset[int] | None]], elapsed: float,
          cpus: Collection[int] | None, skip: set[int]) -> dict[str, Any]:
    wanted = frozenset(cpus) if cpus is not None else None
    used: list[tuple[float, int, str]] = []
    total = on_cells = 0.0
    for pid, (cpu, name, affinity) in after.items():
        if pid in skip or pid not in before or name in ENGINE:
            continue
        share = max(0.0, cpu - before[pid][0]) / elapsed
        if share <= 0:
            continue
        total += share
        if wanted is None or affinity is None or affinity & wanted:
            on_cells += share
        used.append((share, pid, name))
    used.sort(reverse=True)
    return {
        "window_s": round(elapsed, 3),
        "others_cpus": round(total, 3),
        "others_on_cell_cpus": round(on_cells, 3),
        "busiest": [{"pid": pid, "name": name, "cpu_percent": round(100 * share, 1)}
                    for share, pid, name in used[:TOP_PROCESSES]],
    }


def is_busy(load: dict[str, Any], cell_cpus: int) -> list[str]:
    """Why the machine counts as busy for a cell on ``cell_cpus`` CPUs (empty: it does not)."""
    used = load["others_on_cell_cpus"]
    if used >= BUSY_MIN_CPUS and used >= BUSY_SHARE * cell_cpus:
        top = ", ".join(f"{p['name']} (PID {p['pid']}, {p['cpu_percent']:.0f} %)" for p in load["busiest"][:3])
        return [f"other processes kept {used:.2f} of the {cell_cpus} CPU(s) the cells use busy over "
                f"{load['window_s']:.1f} s: {top}"]
    return []


def machine_state(cpus: Collection[int] | None = None, window_s: float = WINDOW_S,
                  exclude: Collection[int] = (), watch: LoadWatch | None = None) -> dict[str, Any]:
    """The state of the machine just before a run on ``cpus`` (None: all of them) starts; the
    other processes' load over ``window_s``, or since ``watch`` last looked."""
    cell_cpus = sorted(cpus) if cpus is not None else sorted(_allowed_cpus())
    load = watch.load(cell_cpus, exclude=exclude) if watch is not None else other_load(cell_cpus, window_s, exclude)
    reasons = is_busy(load, len(cell_cpus))
    try:
        loadavg: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        loadavg = None
    try:
        available: int | None = psutil.virtual_memory().available
    except (OSError, RuntimeError):
        available = None
    return {
        "governors": governors(cell_cpus),
        "boost": boost(),
        "smt": smt(),
        "loadavg": loadavg,
        "mem_available_bytes": available,
        **cpu_identity(),
        **load,
        "cell_cpus": len(cell_cpus),
        "busy": bool(reasons),
        "busy_reasons": reasons,
    }


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def noise_warnings(cpus: set[int] | None = None, window_s: float = 0.3,
                   watch: LoadWatch | None = None, root: Path = SYS_CPU) -> list[str]:
    """Sentences about a machine state known to add noise to the CPUs ``cpus`` (None: all this
    process may use), each with how to fix it; empty when nothing was found.  The load is
    measured over ``window_s``, or since ``watch`` last looked (at least 0.25 s)."""
    cell_cpus = sorted(cpus) if cpus else sorted(_allowed_cpus())
    out = []
    load = watch.load(cell_cpus, 0.25) if watch is not None else other_load(cell_cpus, window_s)
    for reason in is_busy(load, len(cell_cpus)):
        out.append(f"the machine is busy: {reason}. Timings will be noisy; stop those processes or "
                   "wait for them, or give the cells other CPUs ([fixed] cpuset)")
    slow = {g: c for g, c in (governors(cell_cpus, root) or {}).items() if g in ("powersave", "conservative")}
    for governor, governed in slow.items():
        out.append(f"CPU frequency governor {governor!r} on {len(governed)} of the cells' CPUs: clocks "
                   "ramp with load and timings drift; for benchmarks set 'performance' "
                   "(cpupower frequency-set -g performance, as root)")
    return out
