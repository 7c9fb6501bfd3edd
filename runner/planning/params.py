"""The cell parameters: every key a matrix may set, its type, its default and its check.

Each check takes a raw TOML value and returns the canonical value or raises ``ParamError``
with the words that follow the key path in the user's message, e.g.
``expected a positive integer, got "big"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from matrun.frameworks import frameworks
# The harness checks the same choices inside the cell: one definition, there.
from matrun.runner.harness import (  # noqa: F401  (re-exported for the host)
    CONV_ALGOS, DEVICES, LAYOUTS, MODES, OPTIMIZERS, PRECISIONS, PRESETS, UNSET,
)
from matrun.runner.harness.distributed import KVSTORES, SCALINGS
from matrun.runner.harness.models import MODELS as MODEL_ZOO

FRAMEWORKS = tuple(frameworks())
MODELS = tuple(MODEL_ZOO)
DATASETS = ("fashion-mnist", "mnist", "cifar10", "synthetic")

MAX_THREADS = 1024
MAX_WORKERS = 256
MAX_NODES = 1024
_CPUSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_VARIANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}$")


class ParamError(ValueError):
    """A value failed its check; the message is the part after the key path."""


def show(value: Any) -> str:
    """A value as the user wrote it, for messages (strings quoted, long ones cut)."""
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    if isinstance(value, bool):
        text = "true" if value else "false"
    return text if len(text) <= 60 else text[:57] + "..."


def _int(minimum: int, maximum: int | None = None, what: str = "") -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(f"expected {what or _describe_int(minimum)}, got {show(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f" at most {maximum:,}" if maximum is not None else ""
            raise ParamError(f"expected {what or _describe_int(minimum)}{bound}, got {show(value)}")
        return value

    return check


def _describe_int(minimum: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")


def _float(minimum: float, maximum: float | None, *, open_min: bool, what: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(f"expected {what}, got {show(value)}")
        v = float(value)
        too_low = v <= minimum if open_min else v < minimum
        too_high = maximum is not None and v >= maximum
        if too_low or too_high or v != v or v in (float("inf"), float("-inf")):
            raise ParamError(f"expected {what}, got {show(value)}")
        return v

    return check


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            listed = ", ".join(f'"{o}"' for o in options)
            raise ParamError(f"expected one of {listed}, got {show(value)}")
        return value

    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamError(f"expected true or false, got {show(value)}")
    return value


def _threads(value: Any) -> int | str:
    if value == UNSET:
        return UNSET
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise ParamError(f'expected a thread count from 1 to {MAX_THREADS} or "unset", got {show(value)}')
    return value


def _cpuset(value: Any) -> str:
    if not isinstance(value, str) or (value and not _CPUSET.match(value)):
        raise ParamError(f'expected a CPU list such as "0-3,6" (or "" for no pinning), got {show(value)}')
    for part in filter(None, value.split(",")):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise ParamError(f'CPU range "{part}" runs backwards')
    return value


def _variant(value: Any) -> str:
    if not isinstance(value, str) or not _VARIANT.match(value):
        raise ParamError(f"expected a variant name of lower-case letters, digits, '.', '_' or '-', got {show(value)}")
    return value


_MEMORY = re.compile(r"^([0-9]{1,15})([kmg]?)b?$", re.I)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
MIN_MEMORY_LIMIT = 6 * 1024**2  # the Docker engine refuses less than 6 MiB


def _memory(value: Any) -> int:
    """Bytes, from an integer or a string such as "512m" / "2g" (binary units, as Docker's)."""
    if isinstance(value, bool):
        raise ParamError(f'expected a memory size such as "512m" or "2g" (0: no limit), got {show(value)}')
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and _MEMORY.match(value.strip()):
        number, unit = _MEMORY.match(value.strip()).groups()
        size = int(number) * _UNITS[unit.lower()]
    else:
        raise ParamError(f'expected a memory size such as "512m" or "2g" (0: no limit), got {show(value)}')
    if size != 0 and not MIN_MEMORY_LIMIT <= size <= 2**50:
        raise ParamError(f"expected a memory limit from 6m to 1024t (0: no limit), got {show(value)}")
    return size


def _shape(value: Any) -> list[int]:
    if (not isinstance(value, list) or len(value) != 3
            or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096 for v in value)):
        raise ParamError(f"expected [channels, height, width], three integers from 1 to 4096, got {show(value)}")
    return list(value)


@dataclass(frozen=True)
class Param:
    name: str
    check: Callable[[Any], Any]
    default: Any
    help: str
    identity: bool = True  # False: an execution setting that does not change what is measured


PARAMS: dict[str, Param] = {p.name: p for p in (
    Param("framework", _choice(FRAMEWORKS), "torch", "framework adapter"),
    Param("variant", _variant, "cpu", "environment variant of the framework (images/<framework>/requirements-<variant>.txt)"),
    Param("device", _choice(DEVICES), "cpu", "device the cell runs on"),
    Param("gpus", _int(1, 64), 1, "GPUs used by a gpu cell (single-host data parallel)"),
    Param("workers", _int(1, MAX_WORKERS), 1,
          "data-parallel worker processes on each host (DDP, MultiWorkerMirroredStrategy, MXNet dist "
          "kvstore): over CPU processes on the CPU, one GPU each on the GPU"),
    Param("nodes", _int(1, MAX_NODES), 1, "hosts of a multi-node cell (`workers` on each); > 1 runs only "
                                          'with the slurm executor and [slurm] runtime = "local"'),
    Param("scaling", _choice(SCALINGS), "weak",
          'weak: batch_size is per worker (the global batch grows with the workers); strong: batch_size '
          "is the global batch, split across the workers"),
    Param("kvstore", _choice(KVSTORES), "device",
          "MXNet's gradient exchange: device (one process), dist_sync or dist_async (a parameter "
          "server on the cell's host); null for other frameworks"),
    Param("mode", _choice(MODES), "train", "train, or inference (forward passes only, timed per batch)"),
    Param("model", _choice(MODELS), "lenet5", "network (runner/harness/models.py)"),
    Param("dataset", _choice(DATASETS), "fashion-mnist", "dataset"),
    Param("synthetic_shape", _shape, [1, 28, 28], "[C, H, W] of synthetic samples"),
    Param("synthetic_classes", _int(2, 100_000), 10, "classes of synthetic data"),
    Param("synthetic_train", _int(1, 10_000_000), 2048, "synthetic training samples"),
    Param("synthetic_test", _int(1, 10_000_000), 512, "synthetic test samples"),
    Param("train_limit", _int(0), 0, "use only the first N training samples (0: all)"),
    Param("test_limit", _int(0), 0, "use only the first N test samples (0: all)"),
    Param("epochs", _int(1, 100_000), 1, "training epochs (ignored when iterations > 0)"),
    Param("iterations", _int(0, 100_000_000), 0, "train for exactly N optimizer steps (0: use epochs)"),
    Param("batch_size", _int(1, 1_048_576), 64, "training batch size"),
    Param("eval_batch_size", _int(1, 1_048_576), 1000, "evaluation batch size"),
    Param("optimizer", _choice(OPTIMIZERS), "sgd", "optimizer"),
    Param("lr", _float(0.0, None, open_min=True, what="a positive learning rate"), 0.01, "learning rate"),
    Param("momentum", _float(0.0, 1.0, open_min=False, what="a momentum in [0, 1)"), 0.9, "SGD momentum"),
    Param("weight_decay", _float(0.0, None, open_min=False, what="a non-negative weight decay"), 0.0, "weight decay"),
    Param("warmup_steps", _int(0, 1_000_000), 5, "first steps recorded apart and excluded from throughput"),
    Param("threads", _threads, UNSET, 'intra-op threads (framework switch and OMP/MKL/OpenBLAS variables), or "unset"'),
    Param("interop_threads", _threads, UNSET, 'inter-op threads, or "unset"'),
    Param("cpuset", _cpuset, "", 'CPUs the cell is pinned to, e.g. "0-1" ("" : no pinning)'),
    Param("memory_limit", _memory, 0,
          'memory limit of the cell\'s container, e.g. "2g" (swap included; over it the run is oom); '
          "0: none.  Enforced by the docker executor"),
    Param("onednn", _bool, True, "oneDNN (MKL-DNN) primitives on or off"),
    Param("layout", _choice(LAYOUTS), "nchw", "data layout of activations"),
    Param("precision", _choice(PRECISIONS), "fp32", "fp32, tf32, bf16 or fp16 (mixed precision)"),
    Param("conv_algo", _choice(CONV_ALGOS), "heuristic",
          "convolution algorithm choice on the GPU: heuristic, or autotune (exhaustive search)"),
    Param("layer_profile", _bool, False, "also time every layer's forward and backward pass"),
    Param("preset", _choice(PRESETS), "none",
          "framework-default: the optimizer, learning rate, batch size and epochs of the "
          "framework's own official example for the dataset (docs/PRESETS.md)"),
    Param("seed", _int(0, 2**31 - 1), 0, "random seed"),
    Param("timeout", _float(0.0, None, open_min=True, what="a positive number of seconds"), 1800.0,
          "seconds before the cell is killed and recorded as timeout", identity=False),
    Param("onednn_check", _bool, True,
          "count the oneDNN primitives that really execute (a short verbose run before the cell)",
          identity=False),
)}


def cpuset_cpus(cpuset: str) -> set[int]:
    """The CPU ids of a validated cpuset string ("" is the empty set)."""
    cpus: set[int] = set()
    for part in filter(None, cpuset.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus
