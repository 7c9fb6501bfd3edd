"""Chainer adapter (framework ``chainer``, Chainer 7.8.1 on the CPU): every network of the
model zoo as a ``chainer.Chain`` with one child link per entry of its layer list, trained
define-by-run on numpy arrays and timed per step.

On the CPU Chainer *is* numpy: no iDeep (its oneDNN backend, ``ideep4py``, has no build for
Python 3.11), no CuPy (the GPU backend, out of scope), no ChainerX (not in the PyPI sdist).
A convolution is ``im2col_cpu`` + ``numpy.tensordot``, a dense layer ``numpy.dot``: both run
on the OpenBLAS the numpy wheel bundles, the only thread pool in the process.  Everything
else (im2col, pooling, activations, the optimizers) is single-threaded numpy in the Python
thread.  The computation is synchronous: the clock needs no synchronisation, and a sampled
step's phases (``phase_sampling``: a loader's ``input``, ``forward``, ``backward``, ``update``,
each its own call in define-by-run) are read without a device wait.

Switches (Chainer is imported lazily, in ``configure``, after the environment is set):

- ``threads`` → ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` (the host sets them too; numpy's
  OpenBLAS reads them when it loads), then ``threadpoolctl.threadpool_limits`` on that
  OpenBLAS; the probe reports what threadpoolctl reads back.  ``"unset"``: OpenBLAS's own
  default (one thread per CPU).
- ``interop_threads``: refused (no inter-op pool); ``onednn = true``: refused (there is no
  oneDNN; the host refuses both at plan time, framework.toml).  ``layout``: NCHW only.
- ``precision = "fp16"``: Chainer's own mixed precision, ``chainer.mixed16`` as the default
  dtype: links keep float16 weights (BatchNorm's scale and shift float32), the inputs are
  float16, the loss is computed in float32, the optimizer keeps float32 master weights
  (``use_fp32_update``) and scales the loss dynamically (``loss_scaling()``: Chainer's rule,
  the scale doubling from 1 until a gradient overflows, halved on overflow and the update
  skipped).  numpy has no float16 BLAS, so this is much slower than fp32.  The gradients are
  the float16 weights', so the summary's ``gradient_bytes`` counts 2 bytes a parameter
  (``gradient_element_bytes``; BatchNorm's float32 scale and shift are counted at 2 too).
  bf16 (numpy has no bfloat16) and tf32 (a GPU feature) are refused.
- ``seed``: numpy's global generator (Chainer's initialisers and dropout draw from it) and
  Python's ``random``.

Fidelity to the framework-neutral definitions (docs/frameworks/chainer.md): BatchNorm
``decay`` 0.9 / eps 1e-5 (torch's momentum 0.1); max-pool pads with -inf
(``F.max_pooling_2d(cover_all=False)``); Chainer's default initialisers (LeCun normal
weights, zero biases); ``weight_decay`` is coupled L2 (``optimizer_hooks.WeightDecay``, the
gradient += wd·w before the update, as torch's); optimizer constants follow torch: SGD
(``MomentumSGD``, or ``SGD`` for momentum 0), Adam (beta 0.9 / 0.999, eps 1e-8; Chainer adds
eps to sqrt(v) before the bias correction, as MXNet does), AdaDelta (rho 0.9, eps 1e-6,
scaled by ``lr`` as torch's: Chainer's own has no learning rate), RMSprop (alpha 0.99, eps
1e-8 outside the square root).

Data: pixels / 255, then mean 0.5 / std 0.5 (values in [-1, 1]), as every adapter does.
Each epoch permutes the training set with ``numpy.random.default_rng([seed, epoch])`` and
slices batches; the last partial batch is kept.
"""

from __future__ import annotations

import math
import os
import random
import time
from typing import Any, Callable

from ..errors import HarnessError
from .. import distributed
from .. import models as zoo
from ..datasets import Dataset, Split
from ..events import EventLog, StepSample
from ..layers import LayerOp, LayerOps
from ..phases import StepClock
from ..spec import setting
from . import TrainOutcome

NAME = "chainer"
MODELS = tuple(zoo.MODELS)
# (C, H, W) and classes of the datasets whose shape is fixed (synthetic: from the spec).
DATASET_SHAPES = {"fashion-mnist": ((1, 28, 28), 10), "mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")

# Imported by configure(), after the thread variables are set.
chainer: Any = None
F: Any = None
L: Any = None
np: Any = None
_STATE: dict[str, Any] = {}  # what configure did: threadpoolctl's answer


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    """What Chainer cannot run here (the host refuses the same through framework.toml)."""
    model = params["model"]
    if model not in MODELS:
        return f"[params -> model] unknown model {model!r} for chainer (known: {', '.join(MODELS)})"
    if setting(params, "compile") == "compiled":
        return "[params -> compile] Chainer runs define-by-run, op by op: it has no graph compiler"
    if params["device"] != "cpu":
        return "[params -> device] Chainer's GPU backend is CuPy, which this environment does not have (CPU only)"
    if (params.get("workers") or 1) > 1 or (params.get("nodes") or 1) > 1:
        return ("[params -> workers] multi-worker Chainer is ChainerMN, which needs MPI (mpi4py and an MPI "
                "library) and is not part of this environment")
    if params["layout"] != "nchw":
        return "[params -> layout] Chainer 7.8.1 computes in NCHW only on the CPU"
    if params["precision"] in ("bf16", "tf32"):
        why = ("numpy has no bfloat16 type" if params["precision"] == "bf16"
               else "TF32 is a feature of NVIDIA Ampere and later GPUs")
        return f"[params -> precision] {params['precision']} is not supported by Chainer 7.8.1 on the CPU ({why})"
    if params["onednn"] is not None:
        return ("[params -> onednn] Chainer 7.8.1 has no oneDNN here (iDeep, its oneDNN backend, has no build for "
                "Python 3.11): the parameter does not apply and must be null (the host nulls it)")
    if params["interop_threads"] != "unset":
        return "[params -> interop_threads] Chainer has no inter-op thread pool (only numpy's OpenBLAS has threads)"
    shape, classes, key = _input(params)
    if shape is None:
        return None  # load_spec has refused the dataset already
    try:
        for _ in zoo.walk(model, shape, classes):
            pass
    except ValueError as exc:
        return f"[params -> {key}] {exc}"
    return None


def configure(params: dict[str, Any]) -> None:
    """Thread variables, then the import; then threadpoolctl, the dtype and the seed.  Never
    raises for a switch that did not take (the probe reports it)."""
    global chainer, F, L, np
    threads = params["threads"]
    if isinstance(threads, int) and not isinstance(threads, bool):
        for var in THREAD_VARIABLES:
            os.environ[var] = str(threads)
    import numpy
    import chainer as chainer_module
    import chainer.functions as functions
    import chainer.links as links

    chainer, F, L, np = chainer_module, functions, links, numpy
    _STATE["threadpool_limits"] = None
    if isinstance(threads, int) and not isinstance(threads, bool):
        try:
            from threadpoolctl import threadpool_limits

            _STATE["threadpool_limits"] = threadpool_limits(limits=threads, user_api="blas")
        except Exception as exc:  # no threadpoolctl, or one that cannot talk to this BLAS
            _STATE["threadpool_error"] = f"{type(exc).__name__}: {exc}"
    chainer.global_config.use_ideep = "never"  # the default; there is no iDeep anyway
    chainer.global_config.dtype = chainer.mixed16 if params["precision"] == "fp16" else numpy.dtype(numpy.float32)
    numpy.random.seed(params["seed"])
    random.seed(params["seed"])


def probe(params: dict[str, Any]) -> dict[str, Any]:
    blas = numpy_blas()
    threads = blas.get("num_threads")
    cfg = chainer.config
    ideep = bool(chainer.backends.intel64.is_ideep_available())
    cupy = bool(chainer.backends.cuda.available)
    in_force: dict[str, Any] = {
        "threads": threads,
        "threads_source": "numpy's bundled OpenBLAS, read back with threadpoolctl (the only thread pool)",
        "process_threads": _process_threads(),
        "interop_threads": None,
        "onednn": False,
        "onednn_available": False,
        "onednn_source": "no iDeep (chainer.backends.intel64.is_ideep_available() is "
                         f"{str(ideep).lower()}): every kernel is numpy's",
        "ideep_available": ideep,
        "cupy_available": cupy,
        "device": "cpu",
        "layout": "nchw",
        "compile": "eager",  # define-by-run: op by op
        "precision": params["precision"],
        "dtype": "mixed16" if cfg.dtype is chainer.mixed16 else np.dtype(cfg.dtype).name,
        "numpy_version": np.__version__,
        "blas": " ".join(str(x) for x in (blas.get("internal_api"), blas.get("version")) if x) or None,
        "blas_path": blas.get("filepath"),
        "blas_architecture": blas.get("architecture"),
        "chainer_config": {key: str(getattr(cfg, key, None)) for key in (
            "train", "enable_backprop", "type_check", "debug", "use_ideep", "lazy_grad_sum", "autotune",
            "use_cudnn", "dtype")},
        "env": {var: os.environ.get(var) for var in (*THREAD_VARIABLES, "MKL_NUM_THREADS")},
    }
    if _STATE.get("threadpool_error"):
        in_force["threadpool_error"] = _STATE["threadpool_error"]
    mismatches = []
    if isinstance(params["threads"], int) and params["threads"] != threads:
        mismatches.append(f"threads: asked {params['threads']}, in force {threads}")
    if params["onednn"]:
        mismatches.append("onednn: asked true, but Chainer has no oneDNN here (no iDeep)")
    if params["device"] != "cpu":
        mismatches.append(f"device: asked {params['device']}, in force cpu (no CuPy)")
    return {
        "framework_version": chainer.__version__,
        "build": (f"chainer {chainer.__version__}; numpy {np.__version__} ({in_force['blas'] or 'BLAS unknown'}); "
                  f"iDeep {'available' if ideep else 'not available'}; "
                  f"CuPy {'available' if cupy else 'not available'}; ChainerX not built"),
        "in_force": in_force,
        "mismatches": mismatches,
    }


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    if params["device"] != "cpu":
        raise HarnessError("device gpu was asked but this Chainer has no CuPy (the chainer framework is CPU only)")
    feed = Feed(params, dataset.train, dataset.shape)
    x_test, y_test = arrays(dataset.test, dataset.shape)
    held = arrays(dataset.validation, dataset.shape) if dataset.validation else None
    net = build(params["model"], dataset.shape, dataset.classes)
    _emit_model(log, params, dataset, net)
    optimizer = make_optimizer(params)
    optimizer.setup(net)
    if params["weight_decay"]:
        optimizer.add_hook(chainer.optimizer_hooks.WeightDecay(params["weight_decay"]))
    if params["precision"] == "fp16":
        optimizer.loss_scaling()  # dynamic
        optimizer.use_fp32_update()  # float32 master weights
    iterations, patience = params["iterations"], setting(params, "early_stopping")
    full = setting(params, "first_layer_backward") == "full"
    gradients = [0]  # steps whose backward produced the input's gradient
    notes: list[str] = []

    # fp16 (mixed16): the links' weights, and so the gradients the step produces, are float16
    element_bytes = 2 if params["precision"] == "fp16" else 4

    def outcome(**more: Any) -> TrainOutcome:
        return TrainOutcome(notes=notes, model=net, input_gradient_steps=gradients[0],
                            input_pipeline=feed.describe(), gradient_element_bytes=element_bytes, **more)

    epoch, done = 0, 0
    while (done < iterations) if iterations else (epoch < params["epochs"]):
        budget = iterations - done if iterations else None
        starts = distributed.batch_starts(len(feed.y), params["batch_size"], 1, budget)
        steps, loss, accuracy, seconds = train_epoch(net, optimizer, feed, starts, epoch=epoch, seed=params["seed"],
                                                     record=log.steps.append, gradients=gradients if full else None,
                                                     clock_for=log.phase_clock)
        done += steps
        test_loss, test_accuracy, test_seconds = evaluate(net, x_test, y_test, params["eval_batch_size"])
        validation = evaluate(net, *held, params["eval_batch_size"]) if held else None
        log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                  test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                  validation=validation)
        if not math.isfinite(loss):
            notes.append(f"training loss became {loss} in epoch {epoch}; stopped")
            return outcome(diverged=True)
        if log.should_stop(patience):
            return outcome(stopped_early=True)
        epoch += 1
    return outcome()


def infer(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    """Forward passes over the test split in batches (cycling): ``iterations`` or one pass."""
    x, _ = arrays(dataset.test, dataset.shape)
    net = build(params["model"], dataset.shape, dataset.classes)
    _emit_model(log, params, dataset, net)
    batch_size, count = params["batch_size"], len(x)
    starts = list(range(0, count, batch_size))
    batches = [x[s:s + batch_size] for s in starts]
    total = params["iterations"] or len(starts)
    record = log.steps.append
    t_all = time.perf_counter()
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        for index in range(total):
            xb = batches[index % len(starts)]
            t0 = time.perf_counter()
            net(xb)
            t1 = time.perf_counter()
            record((index // len(starts), t0, t1, len(xb)))
    return TrainOutcome(model=net, inference_seconds=time.perf_counter() - t_all)


def layer_ops(params: dict[str, Any], dataset: Dataset, model: Any) -> LayerOps:
    """Per-layer forward / backward callables on real activations of one batch (docs/HARNESS.md).

    Each layer runs on its own leaf ``Variable`` holding the previous layer's output (with
    ``requires_grad`` except for the first, unless ``first_layer_backward = "full"``).  Walking
    back from the loss, ``chainer.grad([y_i], [x_i], [g_i])`` gives the real upstream gradient of
    the layer below; the timed backward is ``chainer.grad([y_i], [x_i, *params], [g_i])``, which
    computes exactly these gradients (nothing accumulates between repeats).  numpy is
    synchronous: ``sync`` is a no-op."""
    net = model
    training = params["mode"] != "inference"
    split = dataset.train if training else dataset.test
    x, y = arrays(split.head(params["batch_size"]), dataset.shape)
    full = setting(params, "first_layer_backward") == "full"
    layers = net.layers()
    Variable = chainer.Variable

    def mode() -> Any:
        return chainer.using_config("train", training)

    def backprop() -> Any:
        return chainer.using_config("enable_backprop", training)

    inputs, outputs = [], []
    h = x
    with mode(), backprop():
        for i, layer in enumerate(layers):
            inp = Variable(h.copy(), requires_grad=training and (i > 0 or full))
            out = layer(inp)
            inputs.append(inp)
            outputs.append(out)
            h = out.array
    upstream: list[Any] = [None] * len(layers)
    if training:
        logits = Variable(outputs[-1].array.copy(), requires_grad=True)
        loss = F.softmax_cross_entropy(F.cast(logits, np.float32) if logits.dtype != np.float32 else logits, y)
        upstream[-1] = chainer.grad([loss], [logits])[0].array
        for i in range(len(layers) - 1, 0, -1):
            upstream[i - 1] = chainer.grad([outputs[i]], [inputs[i]], grad_outputs=[Variable(upstream[i])])[0].array

    def forward(layer: Any, inp: Any) -> Callable[[], Any]:
        def run() -> Any:
            with mode(), backprop():
                return layer(inp)
        return run

    def backward(out: Any, targets: list[Any], grad: Any) -> Callable[[], Any]:
        if not targets:
            return lambda: None
        g = Variable(grad)
        return lambda: chainer.grad([out], targets, grad_outputs=[g])

    ops = []
    for i, layer in enumerate(layers):
        targets = ([inputs[i]] if inputs[i].requires_grad else []) + list(layer.params())
        ops.append(LayerOp(forward=forward(layer, inputs[i]),
                           backward=backward(outputs[i], targets, upstream[i]) if training else None))
    return LayerOps(ops=ops, images=len(x))


# --- models ----------------------------------------------------------------------------


_CLASSES: dict[str, Any] = {}


def _classes() -> dict[str, Any]:
    """The link classes of the zoo's layer kinds, made once Chainer is imported."""
    if _CLASSES:
        return _CLASSES

    class Sequence(chainer.Chain):
        """Child links applied in the order they were added (``names``)."""

        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def add(self, name: str, link: Any) -> None:
            if hasattr(self, name):
                raise HarnessError(f"layer name {name!r} clashes with an attribute of chainer.Chain")
            with self.init_scope():
                setattr(self, name, link)
            self.names.append(name)

        def layers(self) -> list[Any]:
            return [getattr(self, name) for name in self.names]

        def forward(self, x: Any) -> Any:
            for name in self.names:
                x = getattr(self, name)(x)
            return x

    class Apply(chainer.Link):
        """A layer without parameters: ``fn(x)``."""

        def __init__(self, fn: Callable[[Any], Any]) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, x: Any) -> Any:
            return self.fn(x)

    class Residual(chainer.Chain):
        """A ResNet block: main path + (identity or projection) shortcut, sum, ReLU."""

        def __init__(self, main: Any, shortcut: Any) -> None:
            super().__init__()
            with self.init_scope():
                self.main = main
                if shortcut is not None:
                    self.shortcut = shortcut
            self.projection = shortcut is not None

        def forward(self, x: Any) -> Any:
            return F.relu(self.main(x) + (self.shortcut(x) if self.projection else x))

    _CLASSES.update(Sequence=Sequence, Apply=Apply, Residual=Residual)
    return _CLASSES


def build(model: str, shape: tuple[int, int, int], classes: int) -> Any:
    """The zoo's ``model`` as a chain of one child link per layer-list entry, named after it;
    every input size given (no lazy initialisation)."""
    net = _classes()["Sequence"]()
    state = {"c": shape[0], "h": shape[1], "w": shape[2], "flat": None}
    for layer in zoo.MODELS[model]:
        net.add(layer[1], _layer(layer, classes, state))
    return net


def _layer(layer: tuple[Any, ...], classes: int, s: dict[str, Any]) -> Any:
    """The link of one zoo layer; ``s`` tracks channels, height, width and the flat size."""
    kinds = _classes()
    apply = kinds["Apply"]
    kind = layer[0]
    if kind == "conv":
        _, _, out, k, stride, pad, bias = layer
        link = L.Convolution2D(s["c"], out, ksize=k, stride=stride, pad=pad, nobias=not bias)
        s.update(c=out, h=(s["h"] + 2 * pad - k) // stride + 1, w=(s["w"] + 2 * pad - k) // stride + 1)
        return link
    if kind == "bn":  # Chainer's decay is the kept share: 0.9 here is torch's momentum 0.1
        return L.BatchNormalization(s["c"], decay=0.9, eps=1e-5)
    if kind == "relu":
        return apply(F.relu)
    if kind == "maxpool":
        _, _, k, stride, pad = layer
        s.update(h=(s["h"] + 2 * pad - k) // stride + 1, w=(s["w"] + 2 * pad - k) // stride + 1)
        # cover_all=False: the output size of the zoo (and torch); the padding is -inf on the CPU
        return apply(lambda x: F.max_pooling_2d(x, k, stride=stride, pad=pad, cover_all=False))
    if kind == "gap":  # pool and flatten together: (N, C)
        s.update(flat=s["c"], h=1, w=1)
        return apply(lambda x: F.mean(x, axis=(2, 3)))
    if kind == "flatten":  # memory order C·H·W
        s.update(flat=s["c"] * s["h"] * s["w"])
        return apply(lambda x: F.reshape(x, (x.shape[0], -1)))
    if kind == "dense":
        out = layer[2] or classes
        link = L.Linear(s["flat"], out)
        s.update(flat=out, c=out)
        return link
    if kind == "dropout":
        rate = layer[2]
        return apply(lambda x: F.dropout(x, ratio=rate))  # identity unless chainer.config.train
    if kind == "block":
        _, name, bkind, width, stride = layer
        main_layers, short_layers = zoo.block_layers(name, bkind, s["c"], width, stride)
        start = dict(s)
        main = kinds["Sequence"]()
        for sub in main_layers:
            main.add(sub[1], _layer(sub, 0, s))
        end = dict(s)
        shortcut = None
        if short_layers:
            s.update(start)
            shortcut = kinds["Sequence"]()
            for sub in short_layers:
                shortcut.add(sub[1], _layer(sub, 0, s))
        s.update(end)
        return kinds["Residual"](main, shortcut)
    raise HarnessError(f"unknown layer kind {kind!r} in the model zoo")


def parameter_count(net: Any) -> int:
    """Trainable parameters: ``net.params()`` (BatchNorm's running mean / variance are
    persistent values, not parameters)."""
    return int(sum(p.size for p in net.params()))


def _emit_model(log: EventLog, params: dict[str, Any], dataset: Dataset, net: Any) -> None:
    log.emit("model", name=params["model"], parameters=parameter_count(net),
             flops=zoo.forward_flops(params["model"], dataset.shape, dataset.classes))


# --- optimizers ------------------------------------------------------------------------


def make_optimizer(params: dict[str, Any]) -> Any:
    """Chainer's optimizers with torch's constants (weight decay: a hook, added by ``train``)."""
    lr, name = params["lr"], params["optimizer"]
    opts = chainer.optimizers
    if name == "sgd":
        momentum = params["momentum"] or 0.0
        return opts.MomentumSGD(lr=lr, momentum=momentum) if momentum else opts.SGD(lr=lr)
    if name == "adam":
        return opts.Adam(alpha=lr, beta1=0.9, beta2=0.999, eps=1e-8)
    if name == "adadelta":
        return _adadelta()(lr=lr, rho=0.9, eps=1e-6)
    if name == "rmsprop":
        return opts.RMSprop(lr=lr, alpha=0.99, eps=1e-8, eps_inside_sqrt=False)
    raise HarnessError(f"optimizer {name!r} is not supported by the chainer adapter")


def _adadelta() -> type:
    """AdaDelta as torch writes it (``w -= lr * delta``): Chainer's ``AdaDelta`` is the same
    rule without a learning rate (lr 1)."""
    if "AdaDelta" in _CLASSES:
        return _CLASSES["AdaDelta"]
    base = chainer.optimizers.ada_delta

    class AdaDeltaRule(base.AdaDeltaRule):
        """Chainer's rule (state ``msg``, ``msdx``) with the step scaled by ``lr``."""

        def update_core_cpu(self, param: Any) -> None:
            grad = param.grad
            if grad is None:
                return
            hp = self.hyperparam
            msg, msdx = self.state["msg"], self.state["msdx"]
            msg *= hp.rho
            msg += (1 - hp.rho) * grad * grad
            dx = np.sqrt((msdx + hp.eps) / (msg + hp.eps)) * grad
            msdx *= hp.rho
            msdx += (1 - hp.rho) * dx * dx
            param.array -= hp.lr * dx

    class AdaDelta(chainer.optimizer.GradientMethod):
        def __init__(self, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6) -> None:
            super().__init__()
            self.hyperparam.lr = lr
            self.hyperparam.rho = rho
            self.hyperparam.eps = eps

        lr = chainer.optimizer.HyperparameterProxy("lr")
        rho = chainer.optimizer.HyperparameterProxy("rho")
        eps = chainer.optimizer.HyperparameterProxy("eps")

        def create_update_rule(self) -> Any:
            return AdaDeltaRule(self.hyperparam)

    _CLASSES["AdaDelta"] = AdaDelta
    return AdaDelta


# --- training and evaluation -----------------------------------------------------------


def _loss(y: Any, t: Any, reduce: str = "mean") -> Any:
    """Softmax cross-entropy, computed in float32 (fp16 logits are cast first)."""
    if y.dtype != np.float32:
        y = F.cast(y, np.float32)
    return F.softmax_cross_entropy(y, t, reduce=reduce)


def train_epoch(net: Any, optimizer: Any, feed: Feed, starts: list[tuple[int, int]], *, epoch: int, seed: int,
                record: Callable[[StepSample], None], gradients: list[int] | None = None,
                clock_for: Callable[[], StepClock | None] = lambda: None) -> tuple[int, float, float, float]:
    """One pass (or a budget of steps) over the shuffled data: (steps, loss, accuracy, seconds).

    Preloaded data: the batch is sliced before the clock starts; between the two readings are
    ``cleargrads``, forward, loss, backward and ``optimizer.update()`` only.  A loader: the
    batch's fetch from the iterator (and its conversion) comes first, inside the clock.
    ``gradients`` (``first_layer_backward = "full"``): the batch is a ``Variable`` that
    requires its gradient, so backward computes conv1's input gradient too; ``gradients[0]``
    counts the steps where it is non-zero.  ``clock_for``: the next step's phase clock
    (``log.phase_clock``), None for a step that is not sampled.  Define-by-run keeps the
    phases apart: a loader's fetch is ``input`` (preloaded slices have none), ``cleargrads``
    + the forward pass + the loss ``forward``, ``loss.backward`` ``backward``,
    ``optimizer.update`` (weight decay hook, fp16's overflow check and float32 master
    update included) ``update``.  No device wait: numpy has finished when a call returns."""
    t_epoch = time.perf_counter()
    order = np.random.default_rng([seed, epoch]).permutation(len(feed.y))
    batches = feed.epoch(order, starts)
    Variable = chainer.Variable
    steps, loss_sum, correct, seen = 0, 0.0, 0, 0
    try:
        with chainer.using_config("train", True):
            for _start, size in starts:
                clock = clock_for()
                if feed.loader:
                    t0 = time.perf_counter()
                    if clock is not None:
                        clock.start()
                    xb, yb = next(batches)
                    x = Variable(xb, requires_grad=True) if gradients is not None else xb
                    if clock is not None:
                        clock.mark("input")
                else:
                    xb, yb = next(batches)
                    x = Variable(xb, requires_grad=True) if gradients is not None else xb
                    t0 = time.perf_counter()
                    if clock is not None:
                        clock.start()
                net.cleargrads()
                out = net(x)
                loss = _loss(out, yb)
                if clock is not None:
                    clock.mark("forward")
                loss.backward(loss_scale=optimizer._loss_scale)  # None unless fp16's dynamic scaling
                if clock is not None:
                    clock.mark("backward")
                optimizer.update()
                if clock is not None:
                    clock.mark("update")
                t1 = time.perf_counter()
                record((epoch, t0, t1, size))
                if clock is not None:
                    clock.end()
                steps += 1
                loss_sum += float(loss.array) * len(yb)
                correct += int((out.array.argmax(axis=1) == yb).sum())
                seen += len(yb)
                if gradients is not None and x.grad is not None and bool(np.any(x.grad != 0)):
                    gradients[0] += 1
    finally:
        batches.close()
    loss_value = loss_sum / seen if seen else math.nan
    return steps, loss_value, correct / max(seen, 1), time.perf_counter() - t_epoch


def evaluate(net: Any, x: Any, y: Any, batch_size: int) -> tuple[float, float, float]:
    """Mean cross-entropy and accuracy over a split (``train`` off, no graph), and its seconds."""
    t0 = time.perf_counter()
    loss_sum, correct, count = 0.0, 0, len(y)
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        for start in range(0, count, batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            out = net(xb)
            loss_sum += float(_loss(out, yb, reduce="no").array.sum())
            correct += int((out.array.argmax(axis=1) == yb).sum())
    return loss_sum / count, correct / count, time.perf_counter() - t0


# --- data ------------------------------------------------------------------------------


def _input(params: dict[str, Any]) -> tuple[tuple[int, int, int] | None, int, str]:
    if params["dataset"] == "synthetic":
        c, h, w = params["synthetic_shape"]
        return (c, h, w), params["synthetic_classes"], "synthetic_shape"
    if params["dataset"] in DATASET_SHAPES:
        shape, classes = DATASET_SHAPES[params["dataset"]]
        return shape, classes, "model"
    return None, 0, "dataset"


def compute_dtype() -> Any:
    """The dtype of the network's input: float16 under ``mixed16`` (fp16), else float32."""
    return np.dtype(chainer.get_dtype())


def arrays(split: Split, shape: tuple[int, int, int]) -> tuple[Any, Any]:
    """Images normalised to [-1, 1] (NCHW, the compute dtype) and int32 labels, as numpy arrays."""
    x = np.frombuffer(bytes(split.images), np.uint8).reshape(split.count, *shape).astype(np.float32)
    x = ((x / 255.0 - 0.5) / 0.5).astype(compute_dtype(), copy=False)
    y = np.asarray(split.labels, dtype=np.int64).astype(np.int32)
    return x, y


class _Order:
    """An order sampler that hands the iterator the epoch's permutation (the preloaded path's)."""

    def __init__(self, order: Any) -> None:
        self.order = order

    def __call__(self, current_order: Any, current_position: int) -> Any:
        return self.order


class _Samples:
    """What the loader reads: the stored bytes (N, C, H, W), each sample converted when it is
    fetched (float, /255, mean 0.5 / std 0.5: the numbers ``arrays`` gives), its label, and
    the process that converted it."""

    def __init__(self, pixels: Any, labels: Any, dtype: Any) -> None:
        self.pixels, self.labels, self.dtype = pixels, labels, dtype

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, Any, Any]:
        x = ((self.pixels[index].astype(np.float32) / 255.0 - 0.5) / 0.5).astype(self.dtype, copy=False)
        return x, self.labels[index], np.int64(os.getpid())


class Feed:
    """What feeds the training steps (``input_pipeline``).

    ``preloaded``: ``x`` / ``y`` are the normalised arrays; each epoch takes them in the shuffled
    order (untimed) and slices batches.  ``loader``: ``x`` is the stored uint8 images, and each
    epoch makes a Chainer iterator over them whose order sampler gives the same permutation the
    preloaded path uses (so both train on the same batches), ``repeat=False``, the batch size of
    the cell (the last partial batch kept): ``loader_workers`` N > 0 →
    ``chainer.iterators.MultiprocessIterator`` with N worker processes (a ``multiprocessing``
    pool forked at the epoch's first batch, each batch's samples spread over the workers and
    handed back through shared memory sized for one converted sample; Chainer's default of 1
    batch prefetched), finalized at the end of the epoch; 0 → ``SerialIterator`` in the
    training process.  Each sample is converted as it is fetched; ``concat_examples`` stacks
    the batch."""

    def __init__(self, params: dict[str, Any], split: Split, shape: tuple[int, int, int]) -> None:
        self.loader = setting(params, "input_pipeline") == "loader"
        self.workers = setting(params, "loader_workers") if self.loader else 0
        self.batch_size = params["batch_size"]
        self.seen: dict[int, int] = {}  # process id -> samples it converted
        self.batches = 0
        self.batches_in_process = 0
        self.workers_seen = 0  # the most worker processes that converted samples in one epoch
        self.pools = 0  # worker pools started (one per epoch)
        self.main = os.getpid()
        if self.loader:
            self.x = np.frombuffer(bytes(split.images), np.uint8).reshape(split.count, *shape)
            self.y = np.asarray(split.labels, dtype=np.int64).astype(np.int32)
            self.samples = _Samples(self.x, self.y, compute_dtype())
        else:
            self.x, self.y = arrays(split, shape)

    def epoch(self, order: Any, starts: list[tuple[int, int]]) -> Any:
        """The epoch's batches as an iterator of (x, y) numpy arrays whose ``next`` fetches one."""
        if not self.loader:
            xs, ys = self.x[order], self.y[order]
            for start, size in starts:
                self.batches += 1
                yield xs[start:start + size], ys[start:start + size]
            return
        iterators = chainer.iterators
        if self.workers:
            # shared_mem: one converted sample's bytes, so that no batch is measured in this process first
            it = iterators.MultiprocessIterator(self.samples, self.batch_size, repeat=False, n_processes=self.workers,
                                                order_sampler=_Order(order), shared_mem=self.samples[0][0].nbytes)
            self.pools += 1
        else:
            it = iterators.SerialIterator(self.samples, self.batch_size, repeat=False, order_sampler=_Order(order))
        convert = chainer.dataset.concat_examples
        workers: set[int] = set()
        try:
            for _ in starts:
                xb, yb, pids = convert(next(it))
                self.batches += 1
                for pid in pids.tolist():
                    self.seen[pid] = self.seen.get(pid, 0) + 1
                    if pid != self.main:
                        workers.add(pid)
                if (pids == self.main).all():
                    self.batches_in_process += 1
                yield xb, yb
        finally:
            it.finalize()
            self.workers_seen = max(self.workers_seen, len(workers))

    def describe(self) -> dict[str, Any]:
        """The summary's ``input_pipeline``: what really fed the steps."""
        if not self.loader:
            return {"kind": "preloaded"}
        return {"kind": "loader",
                "implementation": ("chainer.iterators.MultiprocessIterator (a multiprocessing pool per epoch, 1 batch "
                                   "prefetched), chainer.dataset.concat_examples" if self.workers else
                                   "chainer.iterators.SerialIterator in the training process, "
                                   "chainer.dataset.concat_examples"),
                "workers": self.workers, "workers_seen": self.workers_seen, "worker_pools": self.pools,
                "worker_processes_total": len([p for p in self.seen if p != self.main]),
                "batches": self.batches, "batches_in_process": self.batches_in_process}


# --- what is in force --------------------------------------------------------------------


def numpy_blas() -> dict[str, Any]:
    """threadpoolctl's record of the BLAS numpy loaded (its bundled OpenBLAS), or {}."""
    try:
        from threadpoolctl import threadpool_info

        pools = [dict(p) for p in threadpool_info() if p.get("user_api") == "blas"]
    except Exception:  # no threadpoolctl, or a broken one: unknown, never a failure
        return {}
    numpy_dir = os.path.dirname(os.path.dirname(np.__file__))
    own = [p for p in pools if str(p.get("filepath", "")).startswith(numpy_dir)]
    return (own or pools or [{}])[0]


def _process_threads() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None
