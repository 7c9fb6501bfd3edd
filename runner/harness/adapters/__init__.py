"""Framework adapters, looked up by framework name.

An adapter is one module that implements the ``Adapter`` protocol below, named by the
framework value; adding a framework is one module here (``ADAPTERS`` finds it).  The harness
(``cell.run_cell``) calls, in this order:

1. ``check(params)`` -> ``None`` or a problem, e.g. ``"[params -> model] ..."``: what this
   framework cannot run (unknown model, input too small).  A problem is a bad spec (exit 2),
   reported before anything is written.
2. ``configure(params)``: apply the thread counts, math-library switches and seed; it runs
   before any parallel work, and never raises for a switch that did not take (``probe``
   reports it as a mismatch).
3. ``probe(params)`` -> dict with ``framework_version``, ``build`` (free text), ``in_force``
   (``threads``, ``interop_threads``, ``onednn``, ``device``, and whatever else the
   framework can tell) and ``mismatches`` (``"threads: asked 2, in force 1"``).  The harness
   adds the Python version, CPU affinity, loaded libraries and the cpuset check.
4. ``train(params, dataset, log)`` -> ``TrainOutcome``: build the model, emit ``model``, train
   and evaluate, appending one ``(epoch, t_start, t_end, images)`` tuple per optimizer step
   to ``log.steps`` and calling ``log.epoch(...)`` once per epoch.  The harness writes the
   summary from what was logged.  The training knobs (``first_layer_backward``,
   ``validation`` / ``early_stopping``, ``input_pipeline`` / ``loader_workers``; read them
   with ``spec.setting``) are every adapter's to apply (docs/HARNESS.md "Training knobs").
   With ``mode = "inference"`` the harness calls
   ``infer(params, dataset, log)`` instead: forward passes only, one ``log.steps`` tuple per
   batch, no ``log.epoch``.  Phase sampling (docs/MODEL.md): before each training step the
   adapter asks ``clock = log.phase_clock(sync)`` (``sync``: the device wait, None on the
   CPU); for a sampled step (``clock`` not None) it calls ``clock.start()`` where the step's
   clock starts, ``clock.mark(phase)`` after each phase it can separate (``phases.PHASES``;
   fused phases under one name joined by ``+``) and ``clock.end()`` after recording the
   step.  A multi-worker cell adds ``calibration`` to its ``exchange``
   (``phases.calibration``: the framework's own all-reduce timed over a few sizes).
5. ``layer_ops(params, dataset, model)`` -> ``layers.LayerOps`` when ``layer_profile`` is
   true: one forward and one backward callable per layer of the model's layer list; the
   harness times them (``layers.profile``) and writes the ``layer`` events.

An adapter usually imports its framework at module level (or inside ``configure`` when a
switch must be set before the import); this module imports an adapter only when it is
looked up, so reading a spec needs no framework.  docs/HARNESS.md has the details.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import HarnessError

if TYPE_CHECKING:
    from ..datasets import Dataset
    from ..events import EventLog
    from ..layers import LayerOps


def _adapter_modules() -> list[str]:
    """The adapter modules of this package: one per framework, named by the framework value
    (``params.framework``), so adding a framework adds a module here and edits nothing."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


# framework name (``params.framework``) -> module in this package (the same name)
ADAPTERS = {name: name for name in _adapter_modules()}


@dataclass
class TrainOutcome:
    """What ``train`` / ``infer`` tell the harness beyond the events they logged.

    ``model``: the framework's model object, handed back to ``layer_ops`` when the cell
    asks for ``layer_profile`` (the harness never looks into it).  ``inference_seconds``:
    wall time of ``infer``'s batches, warm-up included.  ``peak_device_memory_bytes``: the
    accelerator's peak allocation, None on the CPU.  ``exchange``: a multi-worker cell's
    gradient-exchange measurement (``method``, ``seconds_median``, …; docs/HARNESS.md), None
    for a single process.

    The training knobs (docs/HARNESS.md "Training knobs"): ``stopped_early``: training ended
    because ``early_stopping``'s patience ran out (``log.should_stop``).
    ``input_gradient_steps``: the steps whose backward pass really produced a gradient for
    the first layer's input (0 with ``first_layer_backward = "skip"``).  ``input_pipeline``:
    what fed the steps (``kind`` "preloaded" or "loader", and for a loader its
    ``implementation``, ``workers``, the worker processes or threads seen and the batches).
    ``compilation``: the compile step of a ``compile = "compiled"`` cell (``seconds``, timed
    apart from the steps; docs/TRANSFORMERS.md "Compilation").  ``compile_times``: when the
    framework itself reported finishing a compilation (``time.perf_counter()``), from a
    ``compile_watch`` begun before the compile step; the harness counts those that fell inside
    a step as the compilation's ``in_steps``.  None: the framework reports none.
    """

    diverged: bool = False
    notes: list[str] = field(default_factory=list)
    model: Any = None
    inference_seconds: float | None = None
    peak_device_memory_bytes: int | None = None
    exchange: dict[str, Any] | None = None
    stopped_early: bool = False
    input_gradient_steps: int | None = None
    input_pipeline: dict[str, Any] | None = None
    gradient_element_bytes: int = 4
    # ``compile = "compiled"``: how the model was compiled before the first timed step and how
    # long it took (``seconds``, kept out of every step's time), None when it ran eagerly
    compilation: dict[str, Any] | None = None
    compile_times: list[float] | None = None


class Adapter(Protocol):
    NAME: str

    def check(self, params: dict[str, Any]) -> str | None: ...

    def configure(self, params: dict[str, Any]) -> None: ...

    def probe(self, params: dict[str, Any]) -> dict[str, Any]: ...

    def train(self, params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome: ...

    # Optional: without it a cell with mode = "inference" is a bad spec.
    def infer(self, params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome: ...

    # Optional: without it a cell with layer_profile = true is a bad spec.
    def layer_ops(self, params: dict[str, Any], dataset: Dataset, model: Any) -> LayerOps: ...


def known_frameworks() -> list[str]:
    return sorted(ADAPTERS)


def load(framework: str) -> Adapter:
    """The adapter module of ``framework``; HarnessError when the framework cannot be imported."""
    if framework not in ADAPTERS:
        raise HarnessError(f"unknown framework {framework!r} (this harness knows {', '.join(known_frameworks())})")
    try:
        module: ModuleType = importlib.import_module(f"{__name__}.{ADAPTERS[framework]}")
    except ImportError as exc:
        raise HarnessError(f"framework {framework!r} cannot be imported in this environment: {exc}") from exc
    return module  # type: ignore[return-value]  # a module that implements the protocol
