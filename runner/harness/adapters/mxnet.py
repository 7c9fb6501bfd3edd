"""MXNet adapter (framework ``mxnet``, MXNet 1.9.1 Gluon): every network of the model zoo,
hybridized, trained on in-memory NDArrays and timed per step.

The module is named ``mxnet_gluon`` so that it can never shadow the ``mxnet`` package.

MXNet reads its switches from the environment when it starts, so MXNet is imported lazily,
in ``configure``, after the cell's values are put into ``os.environ`` (the host has already
set the same values; a harness started by hand gets them here):

- ``OMP_NUM_THREADS`` (and ``MKL_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``) ← ``threads``:
  the OpenMP threads of one operator.  Unset, MXNet 1.9.1 uses half the processors.
- ``MXNET_CPU_WORKER_NTHREADS`` ← ``interop_threads``: the engine's CPU worker threads, i.e.
  how many independent operators run at the same time (default 1).
- ``MXNET_MKLDNN_ENABLED`` ← ``onednn`` (1/0).  ``MXNET_ONEDNN_ENABLED`` does nothing in 1.9.1.
- ``OPENBLAS_CORETYPE``: the OpenBLAS 0.3.13 bundled in the wheel misdetects recent Intel
  CPUs and then computes wrong GEMMs; ``Haswell`` is set when the environment has no value.
- ``MXNET_CUDNN_AUTOTUNE_DEFAULT`` ← ``conv_algo`` (GPU only: 0 heuristic, 1 autotune).

Timing: MXNet's engine is asynchronous — Python only enqueues operators — so each step is
``mx.nd.waitall()`` (drains what is still queued, outside the clock) → t0 → forward,
backward, ``trainer.step`` → ``mx.nd.waitall()`` → t1.  ``waitall`` is the cheapest *correct*
synchronisation: ``loss.wait_to_read()`` would return before the backward pass and the
parameter updates have run.

Multi-process cells: ``kvstore = "dist_sync"`` / ``"dist_async"`` — MXNet's parameter server:
the launcher starts a scheduler, one server and the workers (``DMLC_*`` variables, all on
127.0.0.1); each worker trains on every ``world``-th sample of the same global batches.
The server updates the weights (``update_on_kvstore=True``): each worker pushes its gradients
and pulls the weights in ``trainer.step``.  ``dist_sync``: the server sums the pushes of all
workers, then updates once (``trainer.step(global batch)``: the global batch's mean);
``dist_async``: the server applies each worker's push as it comes
(``trainer.step(own batch)``), nobody waits.  The server's gradient scale is fixed at the
first step, so a partial last global batch is dropped.  (``update_on_kvstore=False``, i.e. a
push/pull of gradients and a local update, gave replicas with different weights in 2 of 4
runs of a 2-worker MXNet 1.9.1 ``dist_sync`` cell here — the pulled sum was sometimes stale —
and a separate ``push`` + ``pull`` deadlocked; so it is not used.)  The exchange is timed
inside each step: ``waitall`` after backward, then ``trainer.step`` (push, the server's
update, pull) up to its ``waitall``; those extra synchronisation points exist only in
parameter-server cells.

Phase sampling (docs/MODEL.md): a sampled step's clock waits with ``waitall`` before each
reading (on the CPU too); forward, backward, then ``trainer.step`` as ``update`` (one
context) or ``exchange+update`` (the kvstore's push, update and pull are one call); a
loader's fetch is ``input``.  A parameter-server cell first calibrates push + pull through
its kvstore (``_calibrate``).

Data: pixels / 255, then mean 0.5 / std 0.5 (values in [-1, 1]), as every adapter does.
Each epoch permutes the training set with ``random.Random(seed)`` (the same permutation
source on every machine) and slices batches; the last partial batch is kept.
"""

from __future__ import annotations

import math
import os
import random
import signal
import statistics
import threading
import time
from typing import Any, Callable

from ..errors import HarnessError
from .. import distributed
from .. import models as zoo
from ..datasets import IDX_SHAPES, Dataset, Split
from ..events import EventLog
from ..layers import LayerOp, LayerOps
from ..phases import StepClock, calibration, time_collective
from ..spec import model_problem, setting
from ..text import TokenSplit
from . import TrainOutcome
from . import _mxnet_transformers as transformers

#: Seconds ``Feed.close`` waits for the loader's worker pool to stop before killing it.
CLOSE_WAIT_S = 5.0
#: The first kvstore key of the calibration's buffers (``_calibrate``): far above the
#: Trainer's keys (its parameters' indices 0, 1, ...) and an integer like them (MXNet refuses
#: to mix integer and string keys in one kvstore).
CALIBRATION_KEY = 1_000_000

NAME = "mxnet"
MODELS = tuple(zoo.MODELS)
DEFAULT_OPENBLAS_CORETYPE = "Haswell"

# Filled by ``configure`` (MXNet must not be imported before its environment is set).
mx: Any = None
np: Any = None


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    model = params["model"]
    if zoo.is_transformer(model):
        if params["layer_profile"]:
            return "[params -> layer_profile] the mxnet adapter does not time a transformer's units (yet)"
        if setting(params, "attention") == "fused":
            return ("[params -> attention] matrun's MXNet transformers compute attention explicitly (MXNet's "
                    "fused self-attention operators take an interleaved layout not wired here): use "
                    "attention = \"explicit\"")
        if params.get("kvstore") not in (None, "device") or (params["gpus"] or 1) > 1 or distributed.multi_process(params):
            return ("[params -> model] the mxnet transformers run on one device in one process here: use "
                    "workers = 1, gpus = 1, kvstore = \"device\"")
        if params["precision"] != "fp32":
            return f"[params -> precision] the mxnet transformers run in fp32 here, not {params['precision']}"
        return model_problem(params)
    if model not in MODELS:
        return f"[params -> model] unknown model {model!r} for mxnet (known: {', '.join(MODELS)})"
    shape, classes = _input(params)
    try:
        zoo.param_count(model, shape, classes)
    except ValueError as exc:
        key = "synthetic_shape" if params["dataset"] == "synthetic" else "dataset"
        return f"[params -> {key}] {exc}"
    device, precision = params["device"], params["precision"]
    if params["layout"] != "nchw":
        return ("[params -> layout] the mxnet adapter builds NCHW networks only "
                "(MXNet 1.9.1 refuses NHWC convolutions on the CPU)")
    allowed = {"cpu": ("fp32", "bf16"), "gpu": ("fp32", "fp16")}[device]
    if precision not in allowed:
        return f"[params -> precision] {precision} is not supported by MXNet 1.9.1 on the {device} " \
               f"(supported: {', '.join(allowed)})"
    if device == "cpu" and precision == "bf16" and not params["onednn"]:
        return "[params -> precision] bf16 on the CPU needs oneDNN (MXNet's bf16 operators are oneDNN's)"
    return None


def configure(params: dict[str, Any]) -> None:
    """Put the cell's switches into the environment, then import MXNet and seed it."""
    global mx, np
    env = os.environ
    if params["threads"] != "unset":
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(params["threads"])
    if params["interop_threads"] != "unset":
        env["MXNET_CPU_WORKER_NTHREADS"] = str(params["interop_threads"])
    env["MXNET_MKLDNN_ENABLED"] = "1" if params["onednn"] else "0"
    env.setdefault("OPENBLAS_CORETYPE", DEFAULT_OPENBLAS_CORETYPE)
    if params["device"] == "gpu":
        env["MXNET_CUDNN_AUTOTUNE_DEFAULT"] = "1" if params["conv_algo"] == "autotune" else "0"
    env.setdefault("MXNET_STORAGE_FALLBACK_LOG_VERBOSE", "0")
    import mxnet
    import numpy

    mx, np = mxnet, numpy
    mx.random.seed(params["seed"])
    np.random.seed(params["seed"])
    random.seed(params["seed"])


def probe(params: dict[str, Any]) -> dict[str, Any]:
    features = mx.runtime.Features()
    built = sorted(name for name, f in features.items() if f.enabled)
    gpus = mx.context.num_gpus()
    omp, blas = _mxnet_libraries()
    onednn_built = features.is_enabled("MKLDNN")
    onednn_env = os.environ.get("MXNET_MKLDNN_ENABLED", "1")
    onednn = onednn_built and onednn_env.strip() not in ("0", "false", "False")
    device = params["device"]
    used = device if device == "cpu" or gpus >= (params["gpus"] or 1) else "cpu"
    in_force = {
        "threads": omp if omp is not None else _env_int("OMP_NUM_THREADS"),
        "interop_threads": _env_int("MXNET_CPU_WORKER_NTHREADS") or 1,
        "onednn": onednn,
        "onednn_available": onednn_built,
        "device": used,
        "gpus_visible": gpus,
        "env": {var: os.environ.get(var) for var in (
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS",
            "MXNET_MKLDNN_ENABLED", "OPENBLAS_CORETYPE", "MXNET_CUDNN_AUTOTUNE_DEFAULT")},
        "openblas_coretype": blas,
        "precision": params["precision"],
        "layout": params["layout"],
        # hybridized: one static graph (the adapter's default); eager: imperative Gluon
        "compile": "eager" if setting(params, "compile") == "eager" else "compiled",
    }
    if zoo.is_transformer(params["model"]):
        in_force["attention"] = "explicit"
    mismatches = []
    if device == "gpu" and used == "gpu":
        # 0: cuDNN's heuristic; 1 (MXNet's default) and 2: autotuned (docs/frameworks/mxnet.md)
        level = os.environ.get("MXNET_CUDNN_AUTOTUNE_DEFAULT", "1").strip()
        in_force["conv_algo"] = "heuristic" if level == "0" else "autotune"
        if in_force["conv_algo"] != params["conv_algo"]:
            mismatches.append(f"conv_algo: asked {params['conv_algo']}, in force {in_force['conv_algo']} "
                              f"(MXNET_CUDNN_AUTOTUNE_DEFAULT={level})")
    for key in ("threads", "interop_threads"):
        if params[key] != "unset" and params[key] != in_force[key]:
            mismatches.append(f"{key}: asked {params[key]}, in force {in_force[key]}")
    if params["onednn"] and not onednn_built:
        mismatches.append("onednn: asked true, but this MXNet build has no MKLDNN")
    elif params["onednn"] != onednn:
        mismatches.append(f"onednn: asked {_js(params['onednn'])}, in force {_js(onednn)}")
    if used != device:
        mismatches.append(f"device: asked {device}, in force {used} ({gpus} GPU(s) visible to MXNet)")
    return {
        "framework_version": mx.__version__,
        "build": (f"mxnet {mx.__version__}; build features (mx.runtime.Features, what was compiled in, "
                  f"not what runs): {', '.join(built)}"),
        "in_force": in_force,
        "mismatches": mismatches,
    }


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    ctxs = _contexts(params)
    wctx = distributed.current()
    feed = Feed(params, dataset.train, dataset.shape, ctxs[0])  # a loader's worker pool forks here
    x_train, y_train = feed.x, feed.y
    x_test, y_test = _arrays(dataset.test, dataset.shape, ctxs[0])
    held = _arrays(dataset.validation, dataset.shape, ctxs[0]) if dataset.validation and wctx.chief else None
    amp = _amp(params)
    net = _net(params, dataset)
    net.initialize(_initializer(), ctx=ctxs)
    _hybridize(params, net)
    _emit_model(log, params, dataset, net)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    compilation, built = _warm(params, net, loss_fn, x_train, y_train, params["batch_size"])
    kind = params.get("kvstore") or "device"
    dist = kind in distributed.DIST_KVSTORES
    calibrated = None
    if dist:  # connects to the cell's scheduler; every worker sends the optimizer to the server
        kv = mx.kv.create(kind)
        calibrated = _calibrate(kv, wctx, ctxs[0])
        trainer = mx.gluon.Trainer(net.collect_params(), *_optimizer(params), kvstore=kv, update_on_kvstore=True)
    else:
        trainer = mx.gluon.Trainer(net.collect_params(), *_optimizer(params),
                                   kvstore="device" if len(ctxs) > 1 else None)
    if amp is not None:
        amp.init_trainer(trainer)
    shuffle = random.Random(params["seed"])
    iterations = params["iterations"]
    batch = distributed.global_batch(params) if dist else params["batch_size"]
    exchange: list[float] | None = [] if dist else None
    patience = setting(params, "early_stopping")
    full = setting(params, "first_layer_backward") == "full"
    gradients = [0]  # steps whose backward produced the input's gradient

    def outcome(**more: Any) -> TrainOutcome:
        return TrainOutcome(model=net, exchange=_exchange(exchange, log, kind, net, calibrated),
                            input_gradient_steps=gradients[0], input_pipeline=feed.describe(),
                            compilation=compilation, compile_times=built, **more)

    epoch, done = 0, 0
    try:
        while (done < iterations) if iterations else (epoch < params["epochs"]):
            budget = iterations - done if iterations else None
            steps, loss, accuracy, seconds = _train_epoch(
                net, trainer, loss_fn, amp, x_train, y_train, ctxs, epoch=epoch,
                batch_size=batch, budget=budget, shuffle=shuffle, record=log.steps.append,
                wctx=wctx, exchange=exchange, asynchronous=kind == "dist_async", feed=feed,
                gradients=gradients if full else None, clock_for=lambda: log.phase_clock(mx.nd.waitall))
            done += steps
            validation = None
            if wctx.chief:
                test_loss, test_accuracy, test_seconds = evaluate(net, loss_fn, x_test, y_test, ctxs,
                                                                  params["eval_batch_size"])
                if held:
                    validation = evaluate(net, loss_fn, *held, ctxs, params["eval_batch_size"])
            else:  # only rank 0 evaluates
                test_loss = test_accuracy = test_seconds = None
            log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                      test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                      validation=validation)
            if not math.isfinite(loss):
                return outcome(diverged=True, notes=[f"training loss became {loss} in epoch {epoch}; stopped"])
            if log.should_stop(patience):
                return outcome(stopped_early=True)
            epoch += 1
        return outcome()
    finally:
        feed.close()


def _exchange(per_step: list[float] | None, log: EventLog, kind: str, net: Any,
              calibrated: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The push/pull time of a dist kvstore cell (median over the timed steps not sampled for
    phases, like the throughput; ``per_step`` has one entry per step of ``log.steps``) and
    the calibration (``_calibrate``), or None."""
    if per_step is None:
        return None
    sampled = {index for index, _ in log.phases}
    unsampled = [t for i, t in enumerate(per_step) if i not in sampled]
    timed = [t for i, t in enumerate(per_step) if i >= log.warmup_steps and i not in sampled] or unsampled
    steps = [t1 - t0 for _, t0, t1, _ in log.rated()]
    median = statistics.median(timed) if timed else None
    step_median = statistics.median(steps) if steps else None
    what = ("trainer.step(): push of the gradients, the server's update once all workers pushed, pull of "
            "the weights" if kind == "dist_sync" else
            "trainer.step(): push of the gradients, the server's update with them alone, pull of the weights")
    return {"method": f"inside each step, from the end of backward (waitall) to the end of {what} (waitall)",
            "kvstore": kind, "seconds_median": median,
            "fraction_of_step": median / step_median if median is not None and step_median else None,
            "weights_checksum": weights_checksum(net), "calibration": calibrated}


def _calibrate(kv: Any, wctx: distributed.Context, ctx: Any) -> dict[str, Any]:
    """Before training: what one step's exchange does per parameter — push of a float32
    buffer, the server's update, pull of it (waited for) — through the cell's kvstore, timed
    over ``phases.CALIBRATION_BYTES``, each call after the kvstore's barrier (docs/MODEL.md).

    Every worker calls it (``kv.init`` and the barrier are collective).  Each size has a key of
    its own (``CALIBRATION_KEY`` + bytes).  The server needs an updater (``dist_async`` refuses
    a push without one): an SGD of learning rate 0 — the server runs one update per push, as
    in training, and the buffer keeps its values.  The Trainer's own optimizer replaces it
    (every worker sends it before the barrier of the Trainer's ``kv.init``); the closing
    barrier keeps any worker from sending it while another still calibrates.  The exchange
    follows the backward pass (a ``waitall`` between them): it never overlaps it."""
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.0))

    def prepare(size: int) -> Callable[[], None]:
        key = CALIBRATION_KEY + size
        buffer = mx.nd.ones((size // 4,), ctx=ctx, dtype="float32")
        kv.init(key, buffer)

        def call() -> None:
            kv.push(key, buffer)
            kv.pull(key, out=buffer)
            buffer.wait_to_read()  # the pull has written the buffer: the server answered
        return call

    points = time_collective(prepare, barrier=kv._barrier)
    kv._barrier()
    return calibration(points, pattern="parameter server", transport="ps-lite (ZeroMQ, TCP)",
                       workers=wctx.world, overlaps_backward=False)


def weights_checksum(net: Any) -> float:
    """Sum of |w| over the trainable weights: equal on every worker of a synchronous cell."""
    return float(sum(p.data().abs().sum().asscalar() for p in net.collect_params().values()
                     if p.grad_req != "null"))


def infer(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    """Forward passes over the test split in batches (cycling): ``iterations`` or one pass."""
    ctxs = _contexts(params)
    x, _ = _arrays(dataset.test, dataset.shape, ctxs[0])
    _amp(params)
    net = _net(params, dataset)
    net.initialize(_initializer(), ctx=ctxs)
    _hybridize(params, net)
    _emit_model(log, params, dataset, net)
    compilation, built = _warm(params, net, None, x, None, params["batch_size"])
    batch_size, count = params["batch_size"], x.shape[0]
    per_pass = math.ceil(count / batch_size)
    batches = params["iterations"] or per_pass
    record, waitall = log.steps.append, mx.nd.waitall
    t_all = time.perf_counter()
    for index in range(batches):  # outside autograd.record: inference mode, no gradients
        start = (index % per_pass) * batch_size
        xb = x[start:start + batch_size]
        parts = mx.gluon.utils.split_and_load(xb, ctxs, even_split=False) if len(ctxs) > 1 else [xb]
        waitall()
        t0 = time.perf_counter()
        for part in parts:
            net(part)
        waitall()
        t1 = time.perf_counter()
        record((index // per_pass, t0, t1, xb.shape[0]))
    seconds = time.perf_counter() - t_all
    return TrainOutcome(model=net, inference_seconds=seconds, compilation=compilation, compile_times=built)


def layer_ops(params: dict[str, Any], dataset: Dataset, model: Any) -> LayerOps:
    """Per-layer forward / backward callables on real activations of one batch (docs/HARNESS.md).

    Each layer runs on its own copy of the previous layer's output (``attach_grad`` except
    for the first), recorded once; walking back from the loss, ``y.backward(out_grad=g,
    retain_graph=True)`` gives the real upstream gradient of the layer below, and the same
    call is the layer's timed backward.  ``sync`` is ``mx.nd.waitall``: the engine is
    asynchronous on the CPU too, so it must sit inside the clock.
    """
    nd, autograd = mx.nd, mx.autograd
    training = params["mode"] == "train"
    split = dataset.train if training else dataset.test
    ctx = list(model.collect_params().values())[0].list_ctx()[0]
    x, y = _arrays(split, dataset.shape, ctx, limit=params["batch_size"])
    layers = list(model._children.values())  # one child per zoo layer, in order
    inputs, outputs = [], []
    h = x
    full = setting(params, "first_layer_backward") == "full"
    for i, layer in enumerate(layers):
        inp = h.copy()
        if training and (i > 0 or full):
            inp.attach_grad()
        if training:
            with autograd.record():
                h = layer(inp)
        else:
            h = layer(inp)
        inputs.append(inp)
        outputs.append(h)
    upstream: list[Any] = [None] * len(layers)
    if training:
        logits = outputs[-1].copy()
        logits.attach_grad()  # a leaf of its own: the loss's gradient w.r.t. the network's output
        with autograd.record():
            loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(logits.astype("float32"), y)
        loss.backward()
        upstream[-1] = logits.grad.copy()
        for i in range(len(layers) - 1, 0, -1):
            outputs[i].backward(out_grad=upstream[i], retain_graph=True)
            upstream[i - 1] = inputs[i].grad.copy()
        nd.waitall()

    def forward(layer: Any, inp: Any) -> Callable[[], Any]:
        def run() -> Any:
            if training:
                with autograd.train_mode():
                    return layer(inp)
            return layer(inp)
        return run

    def backward(out: Any, grad: Any) -> Callable[[], Any]:
        return lambda: out.backward(out_grad=grad, retain_graph=True)

    ops = [LayerOp(forward=forward(layer, inputs[i]),
                   backward=backward(outputs[i], upstream[i]) if training else None)
           for i, layer in enumerate(layers)]
    return LayerOps(ops=ops, images=x.shape[0], sync=nd.waitall)


# --- models ----------------------------------------------------------------------------


def build(model: str, shape: tuple[int, int, int], classes: int) -> Any:
    """The zoo's ``model`` as a Gluon HybridSequential, every input size given (no deferred init)."""
    net = mx.gluon.nn.HybridSequential(prefix=f"{model}_")
    with net.name_scope():
        state = {"c": shape[0], "h": shape[1], "w": shape[2], "flat": None}
        for layer in zoo.MODELS[model]:
            for block in _layer(layer, classes, state):
                net.add(block)
    return net


def _layer(layer: tuple[Any, ...], classes: int, s: dict[str, Any]) -> list[Any]:
    """Gluon blocks for one zoo layer; ``s`` tracks channels, height, width and the flat size."""
    nn = mx.gluon.nn
    kind, name = layer[0], layer[1]
    if kind == "conv":
        _, _, out, k, stride, pad, bias = layer
        block = nn.Conv2D(out, k, strides=stride, padding=pad, use_bias=bias, in_channels=s["c"],
                          prefix=f"{name}_")
        s.update(c=out, h=(s["h"] + 2 * pad - k) // stride + 1, w=(s["w"] + 2 * pad - k) // stride + 1)
        return [block]
    if kind == "bn":  # MXNet's momentum is the kept share: 0.9 here is torch's 0.1
        return [nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=s["c"], prefix=f"{name}_")]
    if kind == "relu":
        return [nn.Activation("relu", prefix=f"{name}_")]
    if kind == "maxpool":
        _, _, k, stride, pad = layer
        s.update(h=(s["h"] + 2 * pad - k) // stride + 1, w=(s["w"] + 2 * pad - k) // stride + 1)
        return [nn.MaxPool2D(pool_size=k, strides=stride, padding=pad, prefix=f"{name}_")]
    if kind == "gap":  # one child per zoo layer: pool and flatten together
        s.update(flat=s["c"], h=1, w=1)
        gap = nn.HybridSequential(prefix=f"{name}_")
        with gap.name_scope():
            gap.add(nn.GlobalAvgPool2D(), nn.Flatten())
        return [gap]
    if kind == "flatten":
        s.update(flat=s["c"] * s["h"] * s["w"])
        return [nn.Flatten(prefix=f"{name}_")]
    if kind == "dense":
        out = layer[2] or classes
        block = nn.Dense(out, in_units=s["flat"], flatten=False, prefix=f"{name}_")
        s.update(flat=out, c=out)
        return [block]
    if kind == "dropout":
        return [nn.Dropout(layer[2], prefix=f"{name}_")]
    if kind == "block":
        _, _, bkind, width, stride = layer
        return [_residual(name, bkind, width, stride, s)]
    raise HarnessError(f"unknown layer kind {kind!r} in the model zoo")


def _residual(name: str, kind: str, width: int, stride: int, s: dict[str, Any]) -> Any:
    """A ResNet block: main path + (identity or projection) shortcut, sum, ReLU."""
    main_layers, short_layers = zoo.block_layers(name, kind, s["c"], width, stride)
    start = dict(s)
    block = _Residual(prefix=f"{name}_")
    with block.name_scope():
        block.main = mx.gluon.nn.HybridSequential(prefix="main_")
        with block.main.name_scope():
            for layer in main_layers:
                for b in _layer(layer, 0, s):
                    block.main.add(b)
        end = dict(s)
        block.shortcut = None
        if short_layers:
            s.update(start)
            block.shortcut = mx.gluon.nn.HybridSequential(prefix="shortcut_")
            with block.shortcut.name_scope():
                for layer in short_layers:
                    for b in _layer(layer, 0, s):
                        block.shortcut.add(b)
    s.update(end)
    return block


def _residual_class() -> type:
    class Residual(mx.gluon.HybridBlock):
        def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803  (Gluon's signature)
            y = self.main(x)
            return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))
    return Residual


def _Residual(**kwargs: Any) -> Any:  # noqa: N802  (a class made once MXNet is imported)
    global _RESIDUAL
    if _RESIDUAL is None:
        _RESIDUAL = _residual_class()
    return _RESIDUAL(**kwargs)


_RESIDUAL: Any = None


def _emit_model(log: EventLog, params: dict[str, Any], dataset: Dataset, net: Any) -> None:
    log.emit("model", name=params["model"], parameters=parameter_count(net),
             flops=zoo.model_flops(params["model"], dataset.shape, dataset.classes))


def _net(params: dict[str, Any], dataset: Dataset) -> Any:
    """The cell's network: a CNN of the zoo, or a transformer (``_mxnet_transformers``)."""
    if zoo.is_transformer(params["model"]):
        try:
            return transformers.build(params["model"], dataset.shape, dataset.classes)
        except ValueError as exc:
            raise HarnessError(str(exc)) from exc
    return build(params["model"], dataset.shape, dataset.classes)


def _hybridize(params: dict[str, Any], net: Any) -> None:
    """Compile the network into one static graph (MXNet's ``hybridize``: the adapter's default,
    ``compile`` "default" or "compiled"), or leave it imperative (``compile = "eager"``)."""
    if setting(params, "compile") != "eager":
        net.hybridize(static_alloc=True, static_shape=True)


def _warm(params: dict[str, Any], net: Any, loss_fn: Any, x: Any,
          y: Any, batch_size: int) -> tuple[dict[str, Any] | None, list[float] | None]:
    """``compile = "compiled"``: build the hybridized graphs before the first timed step — a
    forward (and, training, a backward: both cached ops) on each batch shape the steps will
    see — with the gradients left unused (the first step overwrites them) and BatchNorm's
    running statistics put back; the seconds are the summary's ``compilation``.  Returns that
    record and the times (``time.perf_counter()``) at which Gluon built the network's cached
    graph (``HybridBlock._build_cache``, watched from here on).  Otherwise (None, None): the
    default hybridizes too, at the first (warm-up) step, as before ``compile``."""
    if setting(params, "compile") != "compiled":
        return None, None
    built: list[float] = []
    build = net._build_cache

    def watched(*args: Any) -> Any:
        result = build(*args)
        built.append(time.perf_counter())
        return result

    net._build_cache = watched
    count = x.shape[0]
    sizes = sorted({min(batch_size, count), count % batch_size} - {0}, reverse=True)
    stats = {name: p.data().copy() for name, p in net.collect_params(".*running.*").items()}
    t0 = time.perf_counter()
    for size in sizes:
        if y is None:
            net(x[:size])
        else:
            with mx.autograd.record():
                loss = loss_fn(net(x[:size]), y[:size])
            loss.backward()
        mx.nd.waitall()
    seconds = time.perf_counter() - t0
    for name, value in stats.items():
        net.collect_params()[name].set_data(value)
    return {"mode": "compiled", "implementation": f"gluon hybridize(static_alloc, static_shape) (mxnet {mx.__version__})",
            "seconds": round(seconds, 6), "batch_sizes": sizes, "backward": y is not None}, built


def _hits(out: Any, y: Any) -> Any:
    """Correct predictions in a batch, per sample: a sequence's share of its positions whose
    next token was predicted (next-token accuracy), an image's 0 or 1."""
    right = out.astype("float32").argmax(axis=-1) == y
    return right.reshape((0, -1)).mean(axis=1).sum()


def parameter_count(net: Any) -> int:
    """Trainable parameters: everything with a gradient (BatchNorm's running mean/var have none)."""
    return sum(int(np.prod(p.shape)) for p in net.collect_params().values() if p.grad_req != "null")


def _initializer() -> Any:
    """Weights uniform in ±1/sqrt(fan_in), as torch's default; biases zero (MXNet's default)."""
    return mx.init.Xavier(rnd_type="uniform", factor_type="in", magnitude=1.0)


# --- training and evaluation -----------------------------------------------------------


def _train_epoch(net: Any, trainer: Any, loss_fn: Any, amp: Any, x: Any, y: Any, ctxs: list[Any], *,
                 epoch: int, batch_size: int, budget: int | None, shuffle: random.Random,
                 record: Callable[[tuple[int, float, float, int]], None],
                 wctx: distributed.Context | None = None, exchange: list[float] | None = None,
                 asynchronous: bool = False, feed: Feed | None = None,
                 gradients: list[int] | None = None,
                 clock_for: Callable[[], StepClock | None] = lambda: None) -> tuple[int, float, float, float]:
    """One pass (or ``budget`` steps) over the shuffled data: (steps, loss, accuracy, seconds).

    A dist kvstore cell (``exchange`` is a list): ``batch_size`` is the global batch, this
    worker trains on its ``[rank::world]`` of each, and each step's push/pull time is appended
    to ``exchange``.  A loader (``feed.loader``): the same batches, fetched from the Gluon
    DataLoader inside the step's clock (after its opening ``waitall``).  ``gradients``
    (``first_layer_backward = "full"``): each batch gets ``attach_grad``, so backward computes
    the first layer's input gradient; ``gradients[0]`` counts the steps where it is non-zero.

    ``clock_for``: the next step's phase clock (``log.phase_clock(nd.waitall)``), None for a
    step that is not sampled.  Its device wait is ``waitall`` on the CPU too: the engine is
    asynchronous, a reading without it would time the enqueueing.  Phases: a loader's fetch
    (and split over the GPUs) is ``input`` (``input+h2d`` on a GPU: the batch is copied to the
    device inside the fetch), preloaded batches are sliced outside the clock and have none;
    ``forward`` (the losses included), ``backward``; ``trainer.step`` is ``update`` with one
    context, ``exchange+update`` otherwise (the kvstore's reduce or push, the update, the
    pull: one call)."""
    nd, autograd = mx.nd, mx.autograd
    wctx = wctx or distributed.Context()
    t_epoch = time.perf_counter()
    order = list(range(y.shape[0]))
    shuffle.shuffle(order)
    count = y.shape[0]
    starts = distributed.batch_starts(count, batch_size, wctx.world, budget)
    if exchange is not None:  # the server's gradient scale is fixed at the first step: full batches only
        starts = [(start, size) for start, size in starts if size == batch_size]
    if not starts and exchange is not None:
        raise HarnessError(f"the training set ({count} samples) has no full global batch of {batch_size}")
    loader = feed is not None and feed.loader is not None
    if loader:
        batches = feed.epoch(order, starts, rank=wctx.rank, world=wctx.world)  # type: ignore[union-attr]
    else:
        index = nd.array(order, ctx=ctxs[0], dtype="int64")
        xs, ys = nd.take(x, index), nd.take(y, index)
    loss_sum = nd.zeros((1,), ctx=ctxs[0])
    correct = nd.zeros((1,), ctx=ctxs[0])
    computed = nd.zeros((1,), ctx=ctxs[0])
    steps, seen = 0, 0
    fetched = "input" if ctxs[0].device_type == "cpu" else "input+h2d"
    stepped = "update" if exchange is None and len(ctxs) == 1 else "exchange+update"
    for start, size in starts:
        end = start + size
        clock = clock_for()
        if loader:
            nd.waitall()  # the previous step's bookkeeping runs outside the clock
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            xb, yb = next(batches)
        elif wctx.distributed:
            take = nd.arange(start + wctx.rank, end, wctx.world, ctx=ctxs[0], dtype="int64")
            xb, yb = nd.take(xs, take), nd.take(ys, take)
        else:
            xb, yb = xs[start:end], ys[start:end]
        if len(ctxs) > 1:
            xparts = mx.gluon.utils.split_and_load(xb, ctxs, even_split=False)
            yparts = mx.gluon.utils.split_and_load(yb, ctxs, even_split=False)
        else:
            xparts, yparts = [xb], [yb]
        if gradients is not None:
            for xp in xparts:
                xp.attach_grad()
        if not loader:
            nd.waitall()  # the previous step's bookkeeping runs outside the clock
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
        elif clock is not None:
            clock.mark(fetched)
        with autograd.record():
            outs = [net(xp) for xp in xparts]
            losses = [loss_fn(o, yp) for o, yp in zip(outs, yparts)]
            if clock is not None:
                clock.mark("forward")
            if amp is not None:
                with amp.scale_loss(losses, trainer) as scaled:
                    autograd.backward(scaled)
        if amp is None:
            autograd.backward(losses)
        if exchange is None:
            if clock is not None:
                clock.mark("backward")
            trainer.step(end - start)
        else:
            nd.waitall()
            if clock is not None:
                clock.mark("backward")
            t_mid = time.perf_counter()
            # push the gradients, the server updates, pull the weights: async applies this
            # worker's gradients alone (its own batch), sync their sum over the global batch
            trainer.step(xb.shape[0] if asynchronous else size)
            nd.waitall()
            exchange.append(time.perf_counter() - t_mid)
        if clock is not None:
            clock.mark(stepped)
        nd.waitall()  # the engine is asynchronous: wait until the update has really run
        t1 = time.perf_counter()
        record((epoch, t0, t1, wctx.recorded_images(size)))
        if clock is not None:
            clock.end()
        for o, lo, yp in zip(outs, losses, yparts):
            o = o.astype("float32")
            loss_sum += lo.astype("float32").sum().as_in_context(ctxs[0])
            correct += _hits(o, yp).as_in_context(ctxs[0])
        if gradients is not None:  # 1 when every part's input gradient has a non-zero element
            computed += nd.min(nd.concat(*[(xp.grad.abs().sum() > 0).reshape((1,)).as_in_context(ctxs[0])
                                           for xp in xparts], dim=0)).reshape((1,))
        steps += 1
        seen += xb.shape[0]
    loss_value, correct_value = float(loss_sum.asscalar()), float(correct.asscalar())
    if gradients is not None:
        gradients[0] += int(computed.asscalar())
    seconds = time.perf_counter() - t_epoch
    return steps, loss_value / seen, correct_value / seen, seconds


def evaluate(net: Any, loss_fn: Any, x: Any, y: Any, ctxs: list[Any], batch_size: int
             ) -> tuple[float, float, float]:
    """Mean cross-entropy and accuracy over the whole test set (inference mode), and its seconds."""
    nd = mx.nd
    t0 = time.perf_counter()
    loss_sum = nd.zeros((1,), ctx=ctxs[0])
    correct = nd.zeros((1,), ctx=ctxs[0])
    count = y.shape[0]
    for start in range(0, count, batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        out = net(xb).astype("float32")
        loss_sum += loss_fn(out, yb).sum()
        correct += _hits(out, yb)
    loss_value, correct_value = float(loss_sum.asscalar()), float(correct.asscalar())
    seconds = time.perf_counter() - t0
    return loss_value / count, correct_value / count, seconds


def _optimizer(params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(optimizer, its arguments): the spec's lr and weight decay; other constants as documented."""
    lr, wd, name = params["lr"], params["weight_decay"], params["optimizer"]
    if name == "sgd":
        return "sgd", {"learning_rate": lr, "momentum": params["momentum"], "wd": wd}
    if name == "adam":  # beta1 0.9, beta2 0.999, epsilon 1e-8 (MXNet's and torch's defaults)
        return "adam", {"learning_rate": lr, "wd": wd}
    if name == "rmsprop":  # MXNet's defaults: decay (gamma1) 0.9, epsilon 1e-8, not centred
        return "rmsprop", {"learning_rate": lr, "wd": wd}
    if name == "adadelta":  # MXNet's AdaDelta has no learning rate: ours scales by lr (torch's form)
        return _adadelta()(learning_rate=lr, wd=wd), {}
    raise HarnessError(f"unknown optimizer {name!r}")


def _adadelta() -> type:
    """AdaDelta as torch writes it (rho 0.9, epsilon 1e-6, ``w -= lr * delta``, weight decay once)."""
    nd = mx.nd

    class AdaDelta(mx.optimizer.Optimizer):
        def __init__(self, rho: float = 0.9, epsilon: float = 1e-6, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.rho, self.epsilon = rho, epsilon

        def create_state(self, index: Any, weight: Any) -> Any:
            return (nd.zeros(weight.shape, weight.context), nd.zeros(weight.shape, weight.context))

        def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
            self._update_count(index)
            lr, wd = self._get_lr(index), self._get_wd(index)
            grad = grad * self.rescale_grad + wd * weight
            if self.clip_gradient is not None:
                grad = nd.clip(grad, -self.clip_gradient, self.clip_gradient)
            acc_g, acc_delta = state
            acc_g[:] = self.rho * acc_g + (1.0 - self.rho) * grad * grad
            delta = nd.sqrt(acc_delta + self.epsilon) / nd.sqrt(acc_g + self.epsilon) * grad
            acc_delta[:] = self.rho * acc_delta + (1.0 - self.rho) * delta * delta
            weight[:] -= lr * delta

    return AdaDelta


def _amp(params: dict[str, Any]) -> Any:
    """MXNet's AMP for bf16 (CPU, oneDNN) or fp16 (GPU); None for fp32.  Before the model is built."""
    precision = params["precision"]
    if precision == "fp32":
        return None
    from mxnet.contrib import amp

    amp.init(target_dtype="bfloat16" if precision == "bf16" else "float16")
    return amp


# --- data and devices ------------------------------------------------------------------


def _input(params: dict[str, Any]) -> tuple[tuple[int, int, int], int]:
    if params["dataset"] == "synthetic":
        c, h, w = params["synthetic_shape"]
        return (c, h, w), params["synthetic_classes"]
    return IDX_SHAPES.get(params["dataset"], (1, 28, 28)), 10


def _arrays(split: Split, shape: tuple[int, int, int], ctx: Any, limit: int | None = None) -> tuple[Any, Any]:
    """float32 images normalised to [-1, 1] (mean 0.5, std 0.5 after /255) and float32 labels on ``ctx``;
    token data: inputs and targets (count, seq_len), as float32 (what ``Embedding`` and the loss take)."""
    if isinstance(split, TokenSplit):
        xs, ys = split.arrays(np, limit or 0)
        return mx.nd.array(xs, ctx=ctx, dtype="float32"), mx.nd.array(ys, ctx=ctx, dtype="float32")
    count = split.count if limit is None else min(limit, split.count)
    pixels = np.frombuffer(bytes(split.images), dtype=np.uint8)[:count * shape[0] * shape[1] * shape[2]]
    x = (pixels.reshape(count, *shape).astype(np.float32) / 255.0 - 0.5) / 0.5
    y = np.frombuffer(bytes(split.labels), dtype=np.int64)[:count].astype(np.float32)
    return mx.nd.array(x, ctx=ctx, dtype="float32"), mx.nd.array(y, ctx=ctx, dtype="float32")


class _Images:
    """What the loader reads: the stored bytes (N, C, H, W), each sample converted when it is
    fetched (float32, /255, mean 0.5 / std 0.5: the numbers ``_arrays`` gives), and its label."""

    def __init__(self, pixels: Any, labels: Any) -> None:
        self.pixels, self.labels = pixels, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return (self.pixels[index].astype(np.float32) / 255.0 - 0.5) / 0.5, self.labels[index]


_MAIN_PID = os.getpid()


def _batchify(samples: list[tuple[Any, Any]]) -> tuple[Any, Any, int]:
    """A batch as MXNet's multi-worker loader makes one (NDArrays in shared memory, in a worker
    process; ``default_mp_batchify_fn``), and the process that made it."""
    ctx = mx.Context("cpu_shared", 0) if os.getpid() != _MAIN_PID else mx.cpu()
    x = np.stack([sample[0] for sample in samples])
    y = np.asarray([sample[1] for sample in samples], dtype=np.float32)
    return mx.nd.array(x, ctx=ctx, dtype="float32"), mx.nd.array(y, ctx=ctx, dtype="float32"), os.getpid()


class _Batches:
    """The loader's batch sampler: the index lists of the current epoch, set by ``Feed.epoch``."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Feed:
    """What feeds the training steps (``input_pipeline``).

    ``preloaded``: ``x`` / ``y`` are the normalised NDArrays on the cell's first context; each
    epoch takes them in a shuffled order and slices batches.  ``loader``: ``x`` is the stored
    uint8 images (numpy) and ``loader`` a ``mx.gluon.data.DataLoader`` over them with
    ``loader_workers`` worker processes (0: in this process; MXNet's own ``prefetch`` of 2
    batches per worker), each sample converted as it is fetched, the batches in shared memory
    (``cpu_shared``) as MXNet's multi-worker batchify makes them; its batch sampler is set each
    epoch from the same permutation the preloaded path uses, so both train on the same
    batches.  MXNet starts the worker pool once, when the loader is made (``__init__``), and
    keeps it for every epoch.
    """

    def __init__(self, params: dict[str, Any], split: Split, shape: tuple[int, int, int], ctx: Any) -> None:
        global _MAIN_PID
        self.ctx = ctx
        self.workers = setting(params, "loader_workers")
        self.loader: Any = None
        self.seen: dict[int, int] = {}  # process id -> batches it made
        self.batches = 0
        if setting(params, "input_pipeline") != "loader":
            self.x, self.y = _arrays(split, shape, ctx)
            return
        _MAIN_PID = os.getpid()
        self.x = np.frombuffer(bytes(split.images), dtype=np.uint8).reshape(split.count, *shape)
        self.y = np.frombuffer(bytes(split.labels), dtype=np.int64).astype(np.float32)
        self.sampler = _Batches()
        self.loader = mx.gluon.data.DataLoader(_Images(self.x, self.y), batch_sampler=self.sampler,
                                               batchify_fn=_batchify, num_workers=self.workers)

    def epoch(self, order: list[int], starts: list[tuple[int, int]], *, rank: int = 0, world: int = 1) -> Any:
        """The epoch's batches (this worker's ``[rank::world]`` share of each global batch at
        ``starts`` of ``order``) on the cell's context, as an iterator whose ``next`` fetches one."""
        self.sampler.batches = [order[start + rank:start + size:world] for start, size in starts]
        return self._fetch(iter(self.loader))

    def _fetch(self, batches: Any) -> Any:
        for xb, yb, pid in batches:
            self.seen[pid] = self.seen.get(pid, 0) + 1
            self.batches += 1
            yield xb.as_in_context(self.ctx), yb.as_in_context(self.ctx)

    def close(self) -> None:
        """Stop the loader's worker pool (MXNet leaves it to the garbage collector).

        ``Pool.terminate`` can block for good when its workers were forked from a process
        with running threads (MXNet's engine): it then waits on a worker that never answers.
        So it runs in a daemon thread; after ``CLOSE_WAIT_S`` the workers are killed (they hold
        nothing the cell needs: every batch was consumed), which lets it finish."""
        pool = getattr(self.loader, "_worker_pool", None)
        if pool is None:
            return
        self.loader._worker_pool = None
        workers = [w for w in getattr(pool, "_pool", []) if w.pid]
        closer = threading.Thread(target=pool.terminate, name="loader-close", daemon=True)
        closer.start()
        closer.join(CLOSE_WAIT_S)
        if closer.is_alive():
            for worker in workers:
                try:
                    os.kill(worker.pid, signal.SIGKILL)
                except OSError:  # already gone
                    pass
            closer.join(CLOSE_WAIT_S)

    def describe(self) -> dict[str, Any]:
        """The summary's ``input_pipeline``: what really fed the steps."""
        if self.loader is None:
            return {"kind": "preloaded"}
        return {"kind": "loader", "implementation": "mxnet.gluon.data.DataLoader", "workers": self.workers,
                "workers_seen": len([pid for pid in self.seen if pid != _MAIN_PID]), "batches": self.batches,
                "batches_in_process": self.seen.get(_MAIN_PID, 0)}


def _contexts(params: dict[str, Any]) -> list[Any]:
    """The MXNet contexts of the cell; HarnessError when a GPU is asked and none is visible."""
    if params["device"] == "cpu":
        return [mx.cpu()]
    have, want = mx.context.num_gpus(), params["gpus"] or 1
    if have < want:
        raise HarnessError(f"device gpu with {want} GPU(s) was asked but MXNet sees {have} "
                           f"(mxnet {mx.__version__}; the CPU wheel has no CUDA: use a cu* variant)")
    return [mx.gpu(i) for i in range(want)]


def _mxnet_libraries() -> tuple[int | None, str | None]:
    """(OpenMP threads of the libgomp MXNet loaded, core type of MXNet's bundled OpenBLAS)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None, None
    omp, blas = None, None
    package = os.path.dirname(mx.__file__)
    for lib in threadpool_info():
        if lib.get("user_api") == "openmp" and omp is None:
            omp = lib.get("num_threads")
        if lib.get("internal_api") == "openblas" and lib.get("filepath", "").startswith(package):
            blas = lib.get("architecture")
    return omp, blas


def _env_int(var: str) -> int | None:
    try:
        return int(os.environ.get(var, ""))
    except ValueError:
        return None


def _js(flag: bool) -> str:
    return "true" if flag else "false"
