"""The GPU and energy monitor of a run: NVML samples of the cell's GPUs, and the CPU packages'
energy from RAPL.

It runs beside the CPU monitor (``monitor.py`` / ``monitor_cgroup.py``), in a thread of the host
launcher, and is started by both the local and the docker executor:

- **GPUs** (``device = "gpu"`` cells): exactly the GPUs the cell was given
  (``gpu.cell_gpu_selectors`` → ``gpu.resolve_gpus``), sampled every :data:`GPU_INTERVAL_S`
  through NVML (``gpu.read_sample``) into ``gpu.jsonl`` — one line per GPU per sample, raw like
  the CPU samples — and summed into the run's aggregates: utilisation, peak memory used, power,
  energy (NVML's energy counter, first to last reading; where a GPU has no counter, power
  integrated over the samples, and ``gpu_energy_source`` says which) and throttling.
- **CPU packages**: the kernel's powercap RAPL counters
  (``/sys/class/powercap/intel-rapl:<N>/energy_uj``, the packages only — their sub-zones are
  parts of them), read at start, every second (the counters wrap, after
  ``max_energy_range_uj``) and at stop: the host's package energy during the run (the whole
  host's, not the cell's alone: docs/BUNDLE.md says so).  Reading them needs root on kernels
  that close them to others; where nothing is readable ``cpu_energy_j`` is None, never 0.

Without GPUs to sample and without RAPL no thread starts.  Nothing here may fail a run: NVML
and sysfs errors become None values and a ``note``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from matrun.runner.executors import gpu as nvml_gpus
from matrun.runner.executors.monitor import SampleFile
from matrun.warehouse.bundles.layout import SCHEMA_VERSION

GPU_INTERVAL_S = 0.5
RAPL_INTERVAL_S = 1.0
RAPL_ROOT = Path("/sys/class/powercap")

#: The aggregates this monitor adds to ``result.json`` ``monitor`` (None: not measured).
AGGREGATE_KEYS = ("gpu_count", "gpu_samples", "gpu_util_avg", "gpu_mem_used_peak_bytes", "gpu_power_avg_w",
                  "gpu_energy_j", "gpu_energy_source", "gpu_throttled", "gpu_throttle_reasons",
                  "cpu_energy_j", "cpu_energy_source", "energy_note")


@dataclass
class _RaplZone:
    name: str
    energy: Path
    wrap: int
    last: int
    total: int = 0

    def read(self) -> None:
        value = _read_int(self.energy)
        if value is None:
            return
        delta = value - self.last
        if delta < 0:  # the counter wrapped
            delta += self.wrap + 1
        self.total += delta
        self.last = value


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def rapl_zones(root: Path = RAPL_ROOT) -> list[_RaplZone]:
    """The readable RAPL package zones under ``root`` (``intel-rapl:<N>``, which AMD CPUs also
    expose on kernels that support them), each primed with its current counter."""
    zones = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith("intel-rapl:") or entry.name.count(":") != 1:
            continue  # intel-rapl:0:0 and the like are parts of a package
        value = _read_int(entry / "energy_uj")
        if value is None:
            continue
        wrap = _read_int(entry / "max_energy_range_uj") or (2**32 - 1)
        try:
            name = (entry / "name").read_text().strip()
        except OSError:
            name = entry.name
        zones.append(_RaplZone(name=name, energy=entry / "energy_uj", wrap=wrap, last=value))
    return zones


@dataclass
class _GpuTotals:
    count: int
    samples: int = 0
    util: float = 0.0
    util_n: int = 0
    mem_peak: int | None = None
    power: float = 0.0
    power_n: int = 0
    throttle: int = 0
    throttle_seen: bool = False
    first_energy: list[float | None] = field(default_factory=list)
    last_energy: list[float | None] = field(default_factory=list)
    power_energy: float = 0.0  # power integrated over the samples, joules
    last_t: float | None = None
    last_power: float | None = None

    def add(self, t: float, samples: list[dict[str, Any]]) -> None:
        self.samples += 1
        utils = [s["util"] for s in samples if isinstance(s["util"], (int, float))]
        if utils:
            self.util += sum(utils) / len(utils)
            self.util_n += 1
        mems = [s["mem_used_bytes"] for s in samples if isinstance(s["mem_used_bytes"], int)]
        if mems:
            self.mem_peak = max([*mems, self.mem_peak or 0])
        powers = [s["power_w"] for s in samples if isinstance(s["power_w"], (int, float))]
        if len(powers) == len(samples):
            total = sum(powers)
            self.power += total
            self.power_n += 1
            if self.last_t is not None and self.last_power is not None:
                self.power_energy += (t - self.last_t) * (total + self.last_power) / 2
            self.last_t, self.last_power = t, total
        for s in samples:
            if isinstance(s["throttle"], int):
                self.throttle |= s["throttle"]
                self.throttle_seen = True
        energies = [s["energy_j"] for s in samples]
        if not self.first_energy:
            self.first_energy = list(energies)
        self.last_energy = list(energies)

    def aggregates(self) -> dict[str, Any]:
        energy, source = None, None
        if self.first_energy and all(isinstance(e, (int, float)) for e in self.first_energy + self.last_energy) \
                and self.samples >= 2:
            energy = sum(b - a for a, b in zip(self.first_energy, self.last_energy))
            source = "nvml-counter"
        elif self.power_n >= 2:
            energy, source = self.power_energy, "nvml-power"
        throttled = self.throttle & nvml_gpus.THROTTLING_MASK
        return {
            "gpu_count": self.count,
            "gpu_samples": self.samples,
            "gpu_util_avg": round(self.util / self.util_n, 2) if self.util_n else None,
            "gpu_mem_used_peak_bytes": self.mem_peak,
            "gpu_power_avg_w": round(self.power / self.power_n, 3) if self.power_n else None,
            "gpu_energy_j": round(energy, 3) if energy is not None else None,
            "gpu_energy_source": source,
            "gpu_throttled": bool(throttled) if self.throttle_seen else None,
            "gpu_throttle_reasons": nvml_gpus.reason_names(throttled) if self.throttle_seen else None,
        }


class EnergyMonitor:
    """Sample the cell's GPUs (``params``, ``env``: the cell's parameters and the environment the
    executor gave it) into ``path`` (``gpu.jsonl``) and the host's RAPL packages, from
    ``start()`` to ``stop()``, which returns the aggregates (:data:`AGGREGATE_KEYS`)."""

    def __init__(self, path: Path, params: Mapping[str, Any], env: Mapping[str, str] | None = None, *,
                 gpu_interval_s: float = GPU_INTERVAL_S, rapl_root: Path = RAPL_ROOT) -> None:
        self.path = path
        self.params = params
        self.env = env
        self.gpu_interval_s = gpu_interval_s
        self.rapl_root = rapl_root
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._zones: list[_RaplZone] = []
        self._gpus: list[dict[str, Any]] = []
        self._nvml: Any = None
        self._nvml_ctx: nvml_gpus.Nvml | None = None
        self._handles: list[Any] = []
        self._totals: _GpuTotals | None = None
        self._t0 = 0.0

    def start(self) -> "EnergyMonitor":
        try:
            self._zones = rapl_zones(self.rapl_root)
            self._open_gpus()
        except Exception as exc:  # a monitor never fails the run
            self.notes.append(f"energy monitor: {type(exc).__name__}: {exc}")
        if self._zones or self._handles:
            self._t0 = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="energy-monitor", daemon=True)
            self._thread.start()
        return self

    def _open_gpus(self) -> None:
        selectors = nvml_gpus.cell_gpu_selectors(self.params, self.env)
        if not selectors:
            return
        try:
            ctx = nvml_gpus.Nvml()
            nvml = ctx.__enter__()
        except nvml_gpus.NvmlUnavailable as exc:
            self.notes.append(f"GPUs not monitored: {exc}")
            return
        self._nvml_ctx, self._nvml = ctx, nvml
        inventory = [nvml_gpus.describe(nvml, i, h) for i, h in nvml_gpus.enumerate_handles(nvml)]
        gpus, unknown = nvml_gpus.resolve_gpus(selectors, inventory)
        if unknown:
            self.notes.append(f"GPUs not found by NVML: {', '.join(unknown)}")
        self._gpus = gpus
        self._handles = [h for h in nvml_gpus.handles(nvml, gpus) if h is not None]
        self._totals = _GpuTotals(count=len(self._handles))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml_ctx is not None:
            self._nvml_ctx.__exit__(None, None, None)
            self._nvml_ctx = None
        out: dict[str, Any] = {key: None for key in AGGREGATE_KEYS}
        if self._totals is not None:
            out.update(self._totals.aggregates())
        if self._zones:
            for zone in self._zones:
                zone.read()
            out["cpu_energy_j"] = round(sum(z.total for z in self._zones) / 1e6, 3)
            out["cpu_energy_source"] = "rapl:" + "+".join(z.name for z in self._zones)
        out["energy_note"] = "; ".join(self.notes) or None
        return out

    def _run(self) -> None:
        header = {"type": "header", "schema_version": SCHEMA_VERSION, "interval_s": self.gpu_interval_s,
                  "gpus": [{k: g.get(k) for k in ("index", "uuid", "name")} for g in self._gpus]}
        out = SampleFile(self.path) if self._handles else None
        try:
            if out is not None:
                out.__enter__()
                out.write(json.dumps(header) + "\n")
            self._loop(out)
        except Exception as exc:
            self.notes.append(f"energy monitor stopped: {type(exc).__name__}: {exc}")
        finally:
            if out is not None:
                out.__exit__(None, None, None)

    def _loop(self, out: SampleFile | None) -> None:
        next_rapl = 0.0
        next_flush = 0.0
        interval = self.gpu_interval_s if self._handles else RAPL_INTERVAL_S
        while True:
            now = time.monotonic()
            t = now - self._t0
            if self._handles and out is not None:
                self._sample_gpus(out, t)
                if now >= next_flush:
                    out.flush()
                    next_flush = now + 1.0
            if now >= next_rapl:
                for zone in self._zones:
                    zone.read()
                next_rapl = now + RAPL_INTERVAL_S
            if self._stop.wait(interval):
                if self._handles and out is not None:
                    self._sample_gpus(out, time.monotonic() - self._t0)  # the last reading
                return

    def _sample_gpus(self, out: SampleFile, t: float) -> None:
        samples = [nvml_gpus.read_sample(self._nvml, h) for h in self._handles]
        t = round(t, 3)  # the time written is the time integrated: gpu.jsonl sums to gpu_energy_j
        for ordinal, sample in enumerate(samples):
            out.write(json.dumps({"t": t, "gpu": ordinal, **sample}) + "\n")
        assert self._totals is not None
        self._totals.add(t, samples)



class MonitorPair:
    """A CPU monitor (``Monitor``, ``CgroupMonitor``) and this GPU and energy monitor, started
    and stopped together; ``stop()`` returns both one's aggregates in one dict (result.json
    ``monitor``)."""

    def __init__(self, cpu: Any, energy: EnergyMonitor) -> None:
        self.cpu = cpu
        self.energy = energy

    def start(self) -> "MonitorPair":
        self.energy.start()
        self.cpu.start()
        return self

    def stop(self) -> dict[str, Any]:
        aggregates = dict(self.cpu.stop())
        aggregates.update(self.energy.stop())
        return aggregates
