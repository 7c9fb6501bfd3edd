"""A stand-in for NVML's Python binding (``pynvml`` of nvidia-ml-py), for the GPU tests on this
GPU-less host.  Only the NVML calls are stood in for: everything around them (matrun's inventory,
device mapping, sampling thread, gpu.jsonl, ingest, views) is the real code.

Each call returns what nvidia-ml-py 13 returns, with NVML's documented types and units
(nvml.h): ``nvmlDeviceGetMemoryInfo`` a struct with ``total`` / ``free`` / ``used`` in bytes,
``nvmlDeviceGetUtilizationRates`` one with ``gpu`` / ``memory`` in percent, power in milliwatts,
the energy counter in millijoules since the driver loaded, clocks in MHz, the temperature in °C,
the clock-event reasons as a bitmask, the CUDA driver version as an int (12040 = 12.4), MIG and
ECC modes as (current, pending).  Errors are the real binding's exception classes
(``NVMLError_NotSupported`` where a GPU lacks a query), so matrun's ``except nvml.NVMLError``
is exercised as it would be on a host.  The values are an H100-like GPU's under load.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

NVML_CLOCK_SM = real.NVML_CLOCK_SM
NVML_CLOCK_MEM = real.NVML_CLOCK_MEM
NVML_TEMPERATURE_GPU = real.NVML_TEMPERATURE_GPU


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 85_520_809_984
    used: list[int] = field(default_factory=lambda: [1_000_000_000])
    util: int = 97
    mem_util: int = 41
    power_mw: list[int] = field(default_factory=lambda: [650_000])
    energy_mj: int | None = 4_000_000_000  # None: the GPU has no energy counter (pre-Volta)
    energy_step_mj: int = 325_000  # what the counter advances per sample
    sm_clock: int = 1980
    mem_clock: int = 2619
    temp: int = 71
    reasons: list[int] = field(default_factory=lambda: [0])
    mig: tuple[int, int] = (0, 0)
    ecc: tuple[int, int] = (1, 1)
    power_limit_mw: int = 700_000
    calls: int = 0


def module(gpus: list[FakeGpu], *, driver: str = "580.95.05", cuda: int = 13000,
           init_error: type[Exception] | None = None) -> types.ModuleType:
    """A module with pynvml's calls over ``gpus`` (NVML index = list position)."""
    m = types.ModuleType("pynvml")
    m.NVMLError = real.NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU
    m.inits = 0
    m.shutdowns = 0

    def init() -> None:
        if init_error is not None:
            raise init_error(real.NVML_ERROR_LIBRARY_NOT_FOUND) if init_error is real.NVMLError \
                else init_error()
        m.inits += 1

    def shutdown() -> None:
        m.shutdowns += 1

    def by_index(index: int) -> FakeGpu:
        if not 0 <= index < len(gpus):
            raise real.NVMLError_InvalidArgument()
        return gpus[index]

    def by_uuid(uuid: Any) -> FakeGpu:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in gpus:
            if gpu.uuid == uuid:
                return gpu
        raise real.NVMLError_NotFound()

    def pick(values: list[int], gpu: FakeGpu) -> int:
        return values[min(gpu.calls, len(values) - 1)]

    def memory(gpu: FakeGpu) -> Any:
        used = pick(gpu.used, gpu)
        return types.SimpleNamespace(total=gpu.total, free=gpu.total - used, used=used)

    def utilization(gpu: FakeGpu) -> Any:
        return types.SimpleNamespace(gpu=gpu.util, memory=gpu.mem_util)

    def energy(gpu: FakeGpu) -> int:
        if gpu.energy_mj is None:
            raise real.NVMLError_NotSupported()
        gpu.energy_mj += gpu.energy_step_mj
        return gpu.energy_mj

    def reasons(gpu: FakeGpu) -> int:
        value = pick(gpu.reasons, gpu)
        gpu.calls += 1  # one sample per call of the last query matrun makes
        return value

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlSystemGetDriverVersion = lambda: driver
    m.nvmlSystemGetCudaDriverVersion = lambda: cuda
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = by_index
    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetUUID = lambda g: g.uuid
    m.nvmlDeviceGetName = lambda g: g.name
    m.nvmlDeviceGetMemoryInfo = memory
    m.nvmlDeviceGetMigMode = lambda g: g.mig
    m.nvmlDeviceGetEccMode = lambda g: g.ecc
    m.nvmlDeviceGetPowerManagementLimit = lambda g: g.power_limit_mw
    m.nvmlDeviceGetMaxClockInfo = lambda g, kind: 1980 if kind == NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetUtilizationRates = utilization
    m.nvmlDeviceGetPowerUsage = lambda g: pick(g.power_mw, g)
    m.nvmlDeviceGetTotalEnergyConsumption = energy
    m.nvmlDeviceGetClockInfo = lambda g, kind: g.sm_clock if kind == NVML_CLOCK_SM else g.mem_clock
    m.nvmlDeviceGetTemperature = lambda g, kind: g.temp
    m.nvmlDeviceGetCurrentClocksEventReasons = reasons
    return m
