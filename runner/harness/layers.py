"""Layer-wise timing (``layer_profile = true``): the bookkeeping shared by every adapter.

After training (or inference) the adapter hands over one forward and one backward callable
per layer of the model's layer list (``models.MODELS[model]``, in order), already bound to
real activations of one batch: the forward of layer *i* runs on the output of layer *i - 1*,
the backward of layer *i* propagates the real upstream gradient (the gradient of the loss
with respect to the layer's output on that batch) to the layer's input and parameters.
Each callable must leave the device idle when ``sync`` returns.

``profile`` runs each callable ``LAYER_WARMUP`` times untimed, then ``LAYER_REPEATS`` times
each timed alone with ``time.perf_counter`` (``sync`` inside the clock), and writes one
``layer`` event per layer with the median, the layer's trainable parameters and its forward
FLOPs per sample (from ``models.walk``; layers it does not list, ReLU and dropout, have 0).
A transformer's layers are its units (``models.transformer_walk``: the embedding, each
block's two LayerNorms, attention and MLP, the final LayerNorm, the head), each recorded with
its group as the kind — ``embedding``, ``norm``, ``attention``, ``mlp``, ``head`` — so the
views and the ``largest_share`` check read them as they read a CNN's convolutions.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import HarnessError
from .events import EventLog
from .models import MODELS, is_transformer, units

LAYER_WARMUP = 5
LAYER_REPEATS = 20


def _no_sync() -> None:
    return None


@dataclass
class LayerOp:
    """One layer's work on the profiled batch; ``backward`` None: not timed (inference)."""

    forward: Callable[[], Any]
    backward: Callable[[], Any] | None = None


@dataclass
class LayerOps:
    """What ``layer_ops`` returns: one ``LayerOp`` per entry of the model's layer list."""

    ops: list[LayerOp]
    images: int  # samples in the profiled batch
    sync: Callable[[], None] = field(default=_no_sync)  # wait for the device (CUDA); no-op on the CPU
    # how the layers were timed, when it differs from the training step's own program (e.g.
    # JAX: each layer compiled alone, unfused): the run's summary carries these notes
    notes: list[str] = field(default_factory=list)


def median_seconds(fn: Callable[[], Any], sync: Callable[[], None], *, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn()`` followed by ``sync()`` over ``repeats`` runs, after ``warmup``."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile(log: EventLog, params: dict[str, Any], shape: tuple[int, int, int], classes: int,
            layer_ops: LayerOps, *, warmup: int = LAYER_WARMUP, repeats: int = LAYER_REPEATS) -> float:
    """Time every layer and write its ``layer`` event; return the seconds the profile took."""
    t_start = time.perf_counter()
    name = params["model"]
    walked = list(units(name, shape, classes))
    # a transformer's units, each under its group as the kind (models.TRANSFORMER_GROUPS)
    layers = [(unit["group"], unit["name"]) for unit in walked] if is_transformer(name) else MODELS[name]
    if len(layer_ops.ops) != len(layers):
        raise HarnessError(f"layer profile of {name}: the adapter gave {len(layer_ops.ops)} layers, "
                           f"the model has {len(layers)}")
    counted = {info["name"]: info for info in walked}
    for index, (layer, op) in enumerate(zip(layers, layer_ops.ops)):
        forward = median_seconds(op.forward, layer_ops.sync, warmup=warmup, repeats=repeats)
        backward = (median_seconds(op.backward, layer_ops.sync, warmup=warmup, repeats=repeats)
                    if op.backward is not None else None)
        info = counted.get(layer[1], {"params": 0, "flops": 0})
        log.emit("layer", name=layer[1], kind=layer[0], index=index, forward_seconds=forward,
                 backward_seconds=backward, repeats=repeats, images=layer_ops.images,
                 params=info["params"], flops=info["flops"])
    return time.perf_counter() - t_start
