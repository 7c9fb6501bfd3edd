"""NVIDIA GPUs through NVML: what the host has, which of them a cell was given, one sample of each.

NVML is NVIDIA's management library; matrun talks to it through NVIDIA's own Python binding,
``nvidia-ml-py`` (``import pynvml``), the optional extra ``matrun[gpu]``.  Everything here
fails soft: without the binding, without the driver's ``libnvidia-ml.so`` (this GPU-less host),
or with a GPU that does not support a query, the answer says why and the value is None — never
an exception into a sweep.

- :func:`gpu_inventory`: the host's driver, the newest CUDA it supports and each GPU (index, UUID,
  model, memory, MIG and ECC mode, power limit, maximum clocks), for the run's host facts and
  ``matrun doctor``.
- :func:`cell_gpu_selectors` (pure): the GPUs a cell was given, as the executor gave them — the
  local executor's ``CUDA_VISIBLE_DEVICES`` (made to count in NVML's order with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), the docker executor's device request (``gpu_ids``, or the
  first ``gpus``), a Slurm task's ``SLURM_JOB_GPUS``; :func:`resolve_gpus` (pure) maps those
  selectors (NVML indexes, ``GPU-…`` or ``MIG-…`` UUIDs) onto the inventory's GPUs.
- :func:`read_sample`: one sample of one GPU — utilisation, memory used, power, the energy
  counter, SM and memory clocks, temperature and the clock-event (throttle) reasons — each field
  None when the GPU does not support it.  The sampling thread is ``runner/executors/energy.py``.

NVML's units are kept where they are exact (bytes, MHz, °C, percent) and converted where the
warehouse wants SI (power mW → W, energy mJ → J).  The throttle bits are NVML's documented
``nvmlClocksEventReason*`` constants (:data:`THROTTLE_REASONS`); "throttled" means one of the
reasons that lower the clocks under load (power cap, thermal, hardware slowdown or power brake),
not idling or an application clock setting.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

#: NVML's clock-event reason bits (nvml.h ``nvmlClocksEventReason*``), by the name matrun records.
THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
#: The reasons that mean the GPU ran slower than it could under load: a run that saw one of
#: them is flagged ``gpu_throttled``.
THROTTLING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
              "hw_power_brake_slowdown")
THROTTLING_MASK = sum(THROTTLE_REASONS[name] for name in THROTTLING)

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "users": 0}


class NvmlUnavailable(Exception):
    """NVML cannot be used here; ``str()`` says why in a sentence."""


def _binding() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable("the NVML binding is not installed (pip install 'matrun[gpu]', "
                              "which installs nvidia-ml-py)") from None


class Nvml:
    """NVML initialised for the life of a ``with`` block; nested and concurrent users share one
    ``nvmlInit`` (NVML counts them too, but a failed init must not be shut down)."""

    def __enter__(self) -> Any:
        with _lock:
            nvml = _binding()
            if _state["users"] == 0:
                try:
                    nvml.nvmlInit()
                except nvml.NVMLError as exc:
                    raise NvmlUnavailable(f"NVML did not initialise: {exc} (no NVIDIA driver on this "
                                          "host, or its libnvidia-ml.so is not visible)") from None
                _state["module"] = nvml
            _state["users"] += 1
            return _state["module"]

    def __exit__(self, *exc_info: object) -> None:
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                nvml, _state["module"] = _state["module"], None
                try:
                    nvml.nvmlShutdown()
                except Exception:  # shutting down must never fail a run
                    pass


def query(nvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, or None when this GPU / driver does not support it (any NVMLError)."""
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _cuda_version(value: Any) -> str | None:
    """NVML's CUDA driver version (an int, 13000 = 13.0) as "13.0"."""
    if not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


def _pair_mode(value: Any) -> bool | None:
    """MIG / ECC mode: NVML answers (current, pending); matrun records the current one."""
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    return bool(value) if isinstance(value, int) else None


def gpu_inventory() -> dict[str, Any]:
    """The host's NVIDIA GPUs as NVML sees them; ``available`` False with ``reason`` where NVML
    cannot be used (then every other field is None or empty)."""
    out: dict[str, Any] = {"available": False, "reason": None, "driver_version": None,
                           "cuda_driver_version": None, "gpus": []}
    try:
        with Nvml() as nvml:
            out["driver_version"] = _text(query(nvml, nvml.nvmlSystemGetDriverVersion))
            out["cuda_driver_version"] = _cuda_version(query(nvml, nvml.nvmlSystemGetCudaDriverVersion))
            out["gpus"] = [describe(nvml, index, handle) for index, handle in enumerate_handles(nvml)]
            out["available"] = True
    except NvmlUnavailable as exc:
        out["reason"] = str(exc)
    return out


def enumerate_handles(nvml: Any) -> list[tuple[int, Any]]:
    """(NVML index, handle) of every GPU NVML answers for."""
    pairs = []
    for index in range(query(nvml, nvml.nvmlDeviceGetCount) or 0):
        handle = query(nvml, nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is not None:
            pairs.append((index, handle))
    return pairs


def describe(nvml: Any, index: int, handle: Any) -> dict[str, Any]:
    memory = query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    limit = query(nvml, nvml.nvmlDeviceGetPowerManagementLimit, handle)
    return {
        "index": index,
        "uuid": _text(query(nvml, nvml.nvmlDeviceGetUUID, handle)),
        "name": _text(query(nvml, nvml.nvmlDeviceGetName, handle)),
        "memory_total_bytes": getattr(memory, "total", None),
        "mig_mode": _pair_mode(query(nvml, nvml.nvmlDeviceGetMigMode, handle)),
        "ecc_mode": _pair_mode(query(nvml, nvml.nvmlDeviceGetEccMode, handle)),
        "power_limit_w": limit / 1000 if isinstance(limit, (int, float)) else None,
        "max_sm_clock_mhz": query(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": query(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM),
    }


def host_gpu_facts() -> dict[str, Any] | None:
    """The run's host facts about GPUs (``result.json`` ``host.gpu``): driver, CUDA driver
    version and each GPU's model, memory, MIG / ECC mode; None where NVML is unavailable (no
    binding, no driver), so a CPU host's record does not change."""
    inventory = gpu_inventory()
    if not inventory["available"]:
        return None
    return {key: inventory[key] for key in ("driver_version", "cuda_driver_version", "gpus")}


# -- which GPUs a cell was given -----------------------------------------------------------


def cell_gpu_selectors(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs a cell was given, as selectors (an NVML index as text, or a UUID), in the order
    the cell sees them.  ``env``: the environment the executor gave the cell (its
    ``CUDA_VISIBLE_DEVICES``, or a Slurm task's ``SLURM_JOB_GPUS``).  A CPU cell has none."""
    if params.get("device") != "gpu":
        return []
    env = env or {}
    for variable in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"):
        value = env.get(variable)
        if value is not None and value.strip() not in ("", "all", "none", "void"):
            return [part.strip() for part in value.split(",") if part.strip()]
    ids = params.get("gpu_ids")
    if ids:
        return [str(i) for i in ids]
    return [str(i) for i in range(int(params.get("gpus") or 1))]


def resolve_gpus(selectors: Sequence[str], gpus: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The inventory's GPUs the ``selectors`` name (index or UUID, a UUID's unique prefix too, as
    CUDA accepts), and the selectors that name none (reported, never guessed)."""
    gpus = [dict(g) for g in gpus]
    found: list[dict[str, Any]] = []
    unknown: list[str] = []
    for selector in selectors:
        match = None
        if selector.isdigit():
            match = next((g for g in gpus if g.get("index") == int(selector)), None)
        else:
            hits = [g for g in gpus if isinstance(g.get("uuid"), str) and g["uuid"].startswith(selector)]
            match = hits[0] if len(hits) == 1 else None
        if match is None:
            unknown.append(selector)
        elif match not in found:
            found.append(match)
    return found, unknown


# -- one sample ------------------------------------------------------------------------------


def handles(nvml: Any, gpus: Sequence[Mapping[str, Any]]) -> list[Any]:
    """NVML handles of the resolved GPUs, by UUID (indexes can change between inits)."""
    out = []
    for gpu in gpus:
        handle = None
        if gpu.get("uuid"):
            handle = query(nvml, nvml.nvmlDeviceGetHandleByUUID, gpu["uuid"])
        if handle is None and gpu.get("index") is not None:
            handle = query(nvml, nvml.nvmlDeviceGetHandleByIndex, gpu["index"])
        out.append(handle)
    return out


def _reasons(nvml: Any, handle: Any) -> Any:
    call = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return query(nvml, call, handle)


def read_sample(nvml: Any, handle: Any) -> dict[str, Any]:
    """One sample of one GPU: each field None where the GPU does not support it."""
    util = query(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    memory = query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    power = query(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
    energy = query(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    reasons = _reasons(nvml, handle)
    return {
        "util": getattr(util, "gpu", None),
        "mem_util": getattr(util, "memory", None),
        "mem_used_bytes": getattr(memory, "used", None),
        "power_w": round(power / 1000, 3) if isinstance(power, (int, float)) else None,
        "energy_j": round(energy / 1000, 3) if isinstance(energy, (int, float)) else None,
        "sm_clock_mhz": query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "temp_c": query(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "throttle": int(reasons) if isinstance(reasons, int) else None,
    }


def reason_names(mask: int) -> list[str]:
    """NVML clock-event bits as matrun's names, in bit order."""
    return [name for name, bit in THROTTLE_REASONS.items() if mask & bit]
