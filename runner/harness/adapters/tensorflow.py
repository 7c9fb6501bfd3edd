"""TensorFlow adapter (framework ``tensorflow``): Keras 3 networks from ``models.py``, a
``tf.function`` training step timed per call.

TensorFlow reads its switches from the environment when it is imported
(``TF_ENABLE_ONEDNN_OPTS``, ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``) or when a
GPU convolution first runs (``TF_CUDNN_USE_AUTOTUNE``), so this module imports TensorFlow
lazily: ``configure`` puts the spec's values into ``os.environ`` (the host has normally set the
same ones already) and only then imports it.

Data: pixels / 255, then mean 0.5 / std 0.5 (values in [-1, 1]), as every adapter; NHWC
tensors for ``layout = "nhwc"`` (TensorFlow's native layout), NCHW (``channels_first``) for
``"nchw"``.  Each epoch permutes the training set with ``stateless_shuffle`` seeded by
``(seed, epoch)`` and slices batches; the last partial batch is kept.  One ``tf.function``
with a ``None`` batch dimension serves every batch size, so the last batch does not retrace;
the first call traces and optimises the graph and is the first (warm-up) step.  On the CPU a
``tf.function`` call returns only when the step has run (checked: reading its result afterwards
takes 0.2 ms after a 0.5 s call); on a GPU the step is followed by
``tf.test.experimental.sync_devices()`` inside the clock.  A sampled step (``phase_sampling``,
docs/MODEL.md) times a loader's ``next`` as ``input`` and the ``tf.function`` call as one fused
phase, ``forward+backward+update`` (``h2d+`` a loader's host batch on a GPU, ``+exchange+`` under
a strategy: ``_fused_phases``); the clock waits with ``sync_devices`` on a GPU.

Multi-worker cells (``workers`` × ``nodes`` > 1, started by the launcher with ``TF_CONFIG``):
``MultiWorkerMirroredStrategy`` (ring all-reduce on the CPU, NCCL on GPUs), created in
``configure`` before any other TensorFlow op, as TensorFlow requires.  Every worker gets the
same global batch and its replica takes every ``world``-th sample from its rank (the
``MirroredStrategy`` code path); the optimizer all-reduces (sums) the gradients of a loss
divided by the global batch.  Before training every worker times that all-reduce over a few
sizes (``_calibrate``: the exchange's ``calibration``).  Only rank 0 evaluates.
TensorFlow's gRPC servers listen on every interface: the launcher runs the workers in a
network namespace with only loopback (local executor) or in one container without network
(docker).

Fidelity to the framework-neutral definitions (docs/frameworks/tensorflow.md):

- Convolutions: ``padding="same"`` where it equals the symmetric padding of the layer list
  (stride 1, pad = (kernel - 1) / 2), else ``ZeroPadding2D`` + ``padding="valid"``.  Max-pool
  padding is ``ZeroPadding2D``, which equals -inf padding because it follows a ReLU (checked).
- BatchNormalization ``momentum=0.9, epsilon=1e-5`` (torch's 0.1 / 1e-5).
- ``weight_decay`` is coupled L2 (``0.5·wd·Σw²`` added to the loss, so the gradient gets
  ``wd·w``) as in torch's optimizers, not Keras' decoupled ``weight_decay``; the reported loss
  leaves it out.  Optimizer constants follow torch: Adam eps 1e-8, Adadelta rho 0.9 eps 1e-6,
  RMSprop rho 0.99 eps 1e-8.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import HarnessError
from .. import distributed
from ..datasets import Dataset, Split
from ..events import EventLog, StepSample
from ..layers import LayerOp, LayerOps
from ..models import MODELS as ZOO
from ..models import TRANSFORMERS, block_layers, block_out_channels, is_transformer, model_flops, walk
from ..phases import StepClock, calibration, time_collective
from ..probe import thread_census
from ..spec import model_problem, setting
from ..text import TokenSplit
from . import TrainOutcome
from . import _tf_transformers as transformers

NAME = "tensorflow"
# (C, H, W) and classes of the datasets whose shape is fixed (synthetic: from the spec).
DATASET_SHAPES = {"fashion-mnist": ((1, 28, 28), 10), "mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}
POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}

tf: Any = None     # tensorflow, imported by configure() after the environment switches
keras: Any = None  # keras 3 (TensorFlow backend), or tf.keras of Keras 2 (TensorFlow 2.12-2.15)
KERAS_VERSION = ""  # the keras package's own version
_MULTI_WORKER: Any = None  # the MultiWorkerMirroredStrategy of a multi-worker cell (configure)
EXCHANGE_PROBE_ROUNDS = 8


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    """What TensorFlow cannot run (the host refuses the same through framework.toml)."""
    model = params["model"]
    if is_transformer(model):
        if setting(params, "attention") == "fused":
            return ("[params -> attention] TensorFlow has no fused scaled-dot-product kernel of its own (Keras 3's "
                    "flash path runs on the JAX and PyTorch back ends only): use attention = \"explicit\"")
        if distributed.multi_process(params) or (params["gpus"] or 1) > 1:
            return ("[params -> model] the tensorflow transformers run on one device in one process here: use "
                    "workers = 1, gpus = 1")
        return model_problem(params)
    if model not in ZOO:
        return f"[params -> model] unknown model {model!r} for tensorflow (known: {', '.join((*ZOO, *TRANSFORMERS))})"
    if params["device"] == "cpu" and params["precision"] == "tf32":
        return "[params -> precision] TF32 is a feature of NVIDIA Ampere and later GPUs"
    if params["device"] == "cpu" and params["layout"] == "nchw" and not params["onednn"]:
        return ("[params -> layout] TensorFlow's Eigen CPU kernels (onednn = false) support only NHWC "
                "convolutions; use layout = \"nhwc\"")
    if params["dataset"] == "synthetic":
        shape, classes, key = tuple(params["synthetic_shape"]), params["synthetic_classes"], "synthetic_shape"
    elif params["dataset"] in DATASET_SHAPES:
        (shape, classes), key = DATASET_SHAPES[params["dataset"]], "dataset"
    else:
        return None  # load_spec has refused it already
    try:
        for _ in walk(model, shape, classes):
            pass
    except ValueError as exc:
        return f"[params -> {key}] {exc}"
    return None


def configure(params: dict[str, Any]) -> None:
    """Environment switches, then the import, then threads (before any op), seed, precision."""
    global tf, keras, KERAS_VERSION
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if params["onednn"] else "0"
    if params["threads"] != "unset":
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(params["threads"])
    if params["interop_threads"] != "unset":
        os.environ["TF_NUM_INTEROP_THREADS"] = str(params["interop_threads"])
    # cuDNN autotuning is on by default in TensorFlow; read when the first GPU conv runs.
    os.environ["TF_CUDNN_USE_AUTOTUNE"] = "1" if params["conv_algo"] == "autotune" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import tensorflow
    import keras as keras_module

    KERAS_VERSION = str(keras_module.__version__)  # tf.keras of Keras 2.15 has no __version__
    if KERAS_VERSION.split(".")[0] == "2":
        # Keras 2 (TensorFlow 2.12-2.15, a cell's ``version``): its API is tf.keras; the top-level
        # package's optimizers are the legacy ones there (no ``build``)
        keras_module = tensorflow.keras
    tf, keras = tensorflow, keras_module
    global _MULTI_WORKER
    if distributed.current().distributed and _MULTI_WORKER is None:
        # before any other op (it sets up the collective runtime and this worker's gRPC server)
        implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL if params["device"] == "gpu"
                          else tf.distribute.experimental.CommunicationImplementation.RING)
        _MULTI_WORKER = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
    try:  # the pools start with the first op: only possible before it
        if params["interop_threads"] != "unset":
            tf.config.threading.set_inter_op_parallelism_threads(params["interop_threads"])
        if params["threads"] != "unset":
            tf.config.threading.set_intra_op_parallelism_threads(params["threads"])
    except RuntimeError:
        pass  # already started: probe reports the counts in force as mismatches
    keras.utils.set_random_seed(params["seed"])
    # compile = "eager": every tf.function runs op by op (TensorFlow's own default is a graph)
    tf.config.run_functions_eagerly(setting(params, "compile") == "eager")
    _keras_config().set_image_data_format("channels_first" if params["layout"] == "nchw" else "channels_last")
    keras.mixed_precision.set_global_policy(POLICIES[params["precision"]])
    if params["device"] == "gpu":
        # TensorFlow allows TF32 by default on Ampere+: fp32 must switch it off to be fp32.
        tf.config.experimental.enable_tensor_float_32_execution(params["precision"] == "tf32")



def _keras_config() -> Any:
    """Where Keras keeps its global settings: ``keras.config`` (Keras 3: TensorFlow 2.16 and
    later), ``keras.backend`` before (Keras 2, a cell's ``version`` of TensorFlow 2.12-2.15)."""
    return getattr(keras, "config", None) or keras.backend

def probe(params: dict[str, Any]) -> dict[str, Any]:
    tf.constant(1.0) + 1.0  # start the runtime (thread pools) so they can be counted
    gpus = tf.config.list_physical_devices("GPU")
    used = "gpu" if params["device"] == "gpu" and gpus else "cpu"
    threads, threads_source = _intra_in_force()
    census = thread_census()
    inter_configured = tf.config.threading.get_inter_op_parallelism_threads()
    onednn, onednn_source = onednn_in_force()
    in_force: dict[str, Any] = {
        "threads": threads,
        "threads_source": threads_source,
        # the inter-op pool's threads are named tf_Compute (counted; checked against the setting)
        "interop_threads": census.get("tf_Compute") or inter_configured or None,
        "onednn": onednn,
        "onednn_source": onednn_source,
        "device": used,
        "gpus_visible": len(gpus),
        "devices": [d.name for d in tf.config.list_physical_devices()],
        "layout": _keras_config().image_data_format(),
        "precision_policy": keras.mixed_precision.global_policy().name,
        "tensor_float_32": bool(tf.config.experimental.tensor_float_32_execution_enabled()) if gpus else None,
        "cudnn_autotune": os.environ.get("TF_CUDNN_USE_AUTOTUNE") if gpus else None,
        "keras_version": KERAS_VERSION,
        "keras_backend": keras.backend.backend(),
        "thread_census": census,
        # graph: tf.function (TensorFlow's default); compiled: tf.function(jit_compile=True), XLA;
        # eager: tf.config.run_functions_eagerly
        "compile": _compile_mode(params),
    }
    if is_transformer(params["model"]):
        in_force["attention"] = "explicit"
    if _MULTI_WORKER is not None:
        ctx = distributed.current()
        in_force.update(rank=ctx.rank, world_size=ctx.world,
                        replicas_in_sync=_MULTI_WORKER.num_replicas_in_sync)
    mismatches = []
    if params["device"] == "gpu" and gpus:
        # TensorFlow autotunes unless TF_CUDNN_USE_AUTOTUNE is false (tensorflow/core/util/env_var.cc)
        autotune = os.environ.get("TF_CUDNN_USE_AUTOTUNE", "1").strip().lower() not in ("0", "false")
        in_force["conv_algo"] = "autotune" if autotune else "heuristic"
        if in_force["conv_algo"] != params["conv_algo"]:
            mismatches.append(f"conv_algo: asked {params['conv_algo']}, in force {in_force['conv_algo']} "
                              f"(TF_CUDNN_USE_AUTOTUNE={os.environ.get('TF_CUDNN_USE_AUTOTUNE')})")
    for key in ("threads", "interop_threads"):
        if params[key] != "unset" and params[key] != in_force[key]:
            mismatches.append(f"{key}: asked {params[key]}, in force {in_force[key]}")
    if onednn is not None and params["onednn"] != onednn:
        mismatches.append(f"onednn: asked {_js(params['onednn'])}, in force {_js(onednn)}")
    if params["device"] != used:
        mismatches.append(f"device: asked {params['device']}, in force {used} (GPUs visible: {len(gpus)})")
    elif used == "gpu" and params["gpus"] and params["gpus"] > len(gpus):
        mismatches.append(f"gpus: asked {params['gpus']}, visible {len(gpus)}")
    build = dict(tf.sysconfig.get_build_info())
    build_text = "; ".join(f"{k}={v}" for k, v in build.items())
    return {
        "framework_version": tf.__version__,
        "build": f"tensorflow {tf.__version__} (git {tf.version.GIT_VERSION}, compiler {tf.version.COMPILER_VERSION}); "
                 f"{build_text}; keras {KERAS_VERSION}",
        "in_force": in_force,
        "mismatches": mismatches,
    }


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    placement = _placement(params)
    ctx = distributed.current()
    batch = distributed.global_batch(params) if ctx.distributed else params["batch_size"]
    with placement.scope():
        feed = Feed(params, dataset.train, dataset.shape, batch)
        x_train, y_train = feed.x, feed.y
        x_test, y_test = tensors(dataset.test, dataset.shape, params["layout"])
        held = (tensors(dataset.validation, dataset.shape, params["layout"])
                if dataset.validation and ctx.chief else None)
        net = _net(params, dataset)
        optimizer = make_optimizer(params)
        optimizer.build(net.model.trainable_variables)
    log.emit("model", name=params["model"], parameters=trainable_parameters(net.model), flops=model_flops(params["model"], dataset.shape, dataset.classes))
    full = setting(params, "first_layer_backward") == "full"
    calibrated = None
    if ctx.distributed:  # the workers have joined (the variables' initial values were broadcast)
        with placement.scope():
            calibrated = _calibrate(placement, ctx, gpu=params["device"] == "gpu")
    jit = setting(params, "compile") == "compiled"
    step = train_step(net.model, optimizer, params["weight_decay"], dataset.shape, params["layout"],
                      placement.strategy, local_results=ctx.distributed, input_gradient=full, jit=jit)
    evaluate_fn = eval_step(net.model, dataset.shape, params["layout"], jit=jit)
    compilation = _trace(step, params)
    iterations, patience = params["iterations"], setting(params, "early_stopping")
    notes = []
    if params["warmup_steps"] == 0:
        notes.append("warmup_steps is 0: step 0 includes tracing and optimising the tf.function")
    gradients = [0]  # steps whose backward produced the input's gradient

    def outcome(**more: Any) -> TrainOutcome:
        return TrainOutcome(notes=notes, model=net, peak_device_memory_bytes=placement.peak_memory(),
                            input_gradient_steps=gradients[0], input_pipeline=feed.describe(),
                            compilation=compilation, **more)

    epoch, done = 0, 0
    while (done < iterations) if iterations else (epoch < params["epochs"]):
        budget = iterations - done if iterations else None
        with placement.scope():
            steps, loss, accuracy, seconds = _train_epoch(
                step, x_train, y_train, epoch=epoch, seed=params["seed"], batch_size=batch,
                budget=budget, sync=placement.sync, record=log.steps.append, ctx=ctx, feed=feed,
                gradients=gradients if full else None, fused=_fused_phases(placement, feed),
                clock_for=lambda: log.phase_clock(placement.sync if placement.gpus else None))
            done += steps
            validation = None
            if ctx.chief:
                test_loss, test_accuracy, test_seconds = evaluate(evaluate_fn, x_test, y_test,
                                                                  params["eval_batch_size"], placement.sync)
                if held:
                    validation = evaluate(evaluate_fn, *held, params["eval_batch_size"], placement.sync)
            else:  # only rank 0 evaluates
                test_loss = test_accuracy = test_seconds = None
        diverged = not math.isfinite(loss)
        log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                  test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                  validation=validation)
        if diverged:
            notes.append(f"training loss became {loss} in epoch {epoch}; stopped")
            return outcome(diverged=True)
        if log.should_stop(patience):
            return outcome(stopped_early=True)
        epoch += 1
    exchange = None
    if ctx.distributed:
        with placement.scope():
            probe_x, probe_y = feed.probe_batch(batch)
            exchange = _exchange_probe(net.model, placement.strategy, probe_x, probe_y, batch, dataset.shape,
                                       params["layout"], log)
        exchange["calibration"] = calibrated
    return outcome(exchange=exchange)


def infer(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    """Forward passes over the test split in order (cycling), timed per batch."""
    placement = _placement(params)
    with placement.scope():
        x_test, _ = tensors(dataset.test, dataset.shape, params["layout"])
        net = _net(params, dataset)
    log.emit("model", name=params["model"], parameters=trainable_parameters(net.model), flops=model_flops(params["model"], dataset.shape, dataset.classes))
    forward = predict_step(net.model, dataset.shape, params["layout"], jit=setting(params, "compile") == "compiled")
    n, batch = dataset.test.count, params["batch_size"]
    starts = list(range(0, n, batch))
    total = params["iterations"] or len(starts)
    t_all = time.perf_counter()
    with placement.scope():
        for index in range(total):
            start = starts[index % len(starts)]
            xb = x_test[start:start + batch]
            t0 = time.perf_counter()
            forward(xb)
            placement.sync()
            t1 = time.perf_counter()
            log.steps.append((index // len(starts), t0, t1, min(batch, n - start)))
    seconds = time.perf_counter() - t_all
    return TrainOutcome(model=net, inference_seconds=seconds, peak_device_memory_bytes=placement.peak_memory())


def layer_ops(params: dict[str, Any], dataset: Dataset, model: Any) -> LayerOps:
    """Each layer of a sequential network on one real batch: forward as a ``tf.function``;
    backward as ``GradientTape.gradient`` of a persistent tape (recorded once) with the real
    upstream gradient, for the layer's input (not the first layer's) and its weights."""
    net: Network = model
    if is_transformer(params["model"]):
        return _transformer_layer_ops(params, dataset, net)
    training = params["mode"] != "inference"
    split = dataset.train if training else dataset.test
    gpu = params["device"] == "gpu"  # one device: the layers alone, without the strategy
    placement = Placement("/GPU:0" if gpu else "/CPU:0", None, 1 if gpu else 0)
    with placement.scope():
        x, y = tensors(split.head(params["batch_size"]), dataset.shape, params["layout"])
        inputs, outputs = [x], []
        with tf.GradientTape(persistent=True) as tape:
            for unit in net.units:
                tape.watch(inputs[-1])
                outputs.append(unit(inputs[-1], training=training))
                inputs.append(outputs[-1])
            logits = tf.cast(outputs[-1], tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        upstream = tape.gradient(loss, outputs) if training else [None] * len(outputs)
        del tape
        skip_first = setting(params, "first_layer_backward") == "skip"
        ops = [_layer_op(unit, tf.identity(inputs[i]), upstream[i], first=i == 0 and skip_first, training=training)
               for i, unit in enumerate(net.units)]
    return LayerOps(ops=ops, images=int(x.shape[0]), sync=placement.sync)


def _transformer_layer_ops(params: dict[str, Any], dataset: Dataset, net: Network) -> LayerOps:
    """A transformer's units (``_tf_transformers.units``) on one real batch, as ``layer_ops``
    times a CNN's layers: forward on the unit's real input (one connected pass through the
    units), backward given the real gradient of the loss with respect to the unit's output (the
    residual additions between units are not timed; the embedding takes no input gradient)."""
    training = params["mode"] != "inference"
    split = dataset.train if training else dataset.test
    gpu = params["device"] == "gpu"
    placement = Placement("/GPU:0" if gpu else "/CPU:0", None, 1 if gpu else 0)
    with placement.scope():
        x, y = tensors(split.head(params["batch_size"]), dataset.shape, params["layout"])
        listed = transformers.units(net.model)
        with tf.GradientTape() as tape:
            inputs, outputs = transformers.unit_inputs(listed, x)
            logits = tf.cast(outputs[-1], tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        upstream = tape.gradient(loss, outputs) if training else [None] * len(outputs)
        del tape
        ops = [_layer_op(unit, tf.identity(inputs[i]), upstream[i], first=i == 0, training=training)
               for i, unit in enumerate(listed)]
    return LayerOps(ops=ops, images=int(x.shape[0]), sync=placement.sync)


# --- what is in force --------------------------------------------------------------------


def _intra_in_force() -> tuple[int, str]:
    """The intra-op pool size and where it comes from (TensorFlow has no getter for the pool)."""
    configured = tf.config.threading.get_intra_op_parallelism_threads()
    if configured:
        return configured, "tf.config.threading.set_intra_op_parallelism_threads"
    env = os.environ.get("TF_NUM_INTRAOP_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env), "TF_NUM_INTRAOP_THREADS"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus, "TensorFlow default: the CPUs this process may run on"


def onednn_in_force() -> tuple[bool | None, str]:
    """Whether TensorFlow's oneDNN graph rewrite is on: ``IsMklEnabled()`` is true only for a
    oneDNN build with TF_ENABLE_ONEDNN_OPTS not 0 (checked both ways).  Eigen's matrix
    products use oneDNN's gemm either way (the oneDNN check counts them as ``gemm_api``)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled()), "IsMklEnabled (oneDNN build and TF_ENABLE_ONEDNN_OPTS)"
    except (ImportError, AttributeError):
        value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
        return (None if value is None else value != "0"), "TF_ENABLE_ONEDNN_OPTS (IsMklEnabled not importable)"


# --- devices ---------------------------------------------------------------------------


@dataclass
class Placement:
    """Where the model runs: a device scope, or a MirroredStrategy over ``gpus`` GPUs."""

    device: str
    strategy: Any = None
    gpus: int = 0  # GPUs used (0 on the CPU)

    def scope(self) -> Any:
        return self.strategy.scope() if self.strategy is not None else tf.device(self.device)

    def sync(self) -> None:
        if self.gpus:
            tf.test.experimental.sync_devices()

    def reset_peak_memory(self) -> None:
        for index in range(self.gpus):
            try:
                tf.config.experimental.reset_memory_stats(f"GPU:{index}")
            except (ValueError, RuntimeError):
                pass

    def peak_memory(self) -> int | None:
        """Peak bytes allocated, summed over the GPUs used; None on the CPU or if unknown."""
        if not self.gpus:
            return None
        try:
            return sum(int(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"]) for i in range(self.gpus))
        except (ValueError, KeyError, RuntimeError):
            return None


def _placement(params: dict[str, Any]) -> Placement:
    if _MULTI_WORKER is not None:  # one replica per worker: its CPU, or its one GPU
        gpu = params["device"] == "gpu"
        if gpu and not tf.config.list_physical_devices("GPU"):
            raise HarnessError("device 'gpu' was asked but this worker's TensorFlow sees no GPU")
        placement = Placement("/GPU:0" if gpu else "/CPU:0", _MULTI_WORKER, 1 if gpu else 0)
        placement.reset_peak_memory()
        return placement
    if params["device"] != "gpu":
        return Placement("/CPU:0")
    gpus = tf.config.list_physical_devices("GPU")
    build = dict(tf.sysconfig.get_build_info())
    if not gpus:
        raise HarnessError(f"device 'gpu' was asked but TensorFlow sees no GPU (tensorflow {tf.__version__}, "
                           f"CUDA build: {build.get('is_cuda_build', False)})")
    count = params["gpus"] or 1
    if count > len(gpus):
        raise HarnessError(f"{count} GPUs were asked but TensorFlow sees {len(gpus)}")
    strategy = tf.distribute.MirroredStrategy(devices=[f"/GPU:{i}" for i in range(count)]) if count > 1 else None
    placement = Placement("/GPU:0", strategy, count)
    placement.reset_peak_memory()
    return placement


# --- models ----------------------------------------------------------------------------


@dataclass
class Network:
    """The Keras model and its units: one Keras layer (or small model) per layer-list entry."""

    model: Any
    units: list[Any]


def build(name: str, shape: tuple[int, int, int], classes: int, layout: str) -> Network:
    """The network ``models.MODELS[name]`` as a Keras functional model of one unit per entry."""
    first = layout == "nchw"
    c, h, w = shape
    inputs = keras.Input(shape=(c, h, w) if first else (h, w, c), name="images")
    x, units, previous = inputs, [], None
    for layer in ZOO[name]:
        unit = _unit(layer, x, classes, first=first, previous=previous)
        x = unit(x)
        units.append(unit)
        previous = layer[0]
    return Network(keras.Model(inputs, x, name=name), units)


def _unit(layer: tuple[Any, ...], x: Any, classes: int, *, first: bool, previous: str | None) -> Any:
    kind, name = layer[0], layer[1]
    fmt = "channels_first" if first else "channels_last"
    if kind == "conv":
        return _conv(layer, fmt)
    if kind == "bn":
        return _bn(name, first)
    if kind == "relu":
        return keras.layers.ReLU(name=name)
    if kind == "maxpool":
        _, _, k, stride, pad = layer
        pool = keras.layers.MaxPooling2D(k, stride, padding="valid", data_format=fmt, name=name)
        if not pad:
            return pool
        if previous != "relu":  # zero padding equals -inf padding only on non-negative inputs
            raise HarnessError(f"max-pool {name} pads a layer that is not a ReLU; zero padding would change it")
        return keras.Sequential([keras.layers.ZeroPadding2D(pad, data_format=fmt, name=f"{name}_pad"), pool],
                                name=name)
    if kind == "gap":
        return keras.layers.GlobalAveragePooling2D(data_format=fmt, name=name)
    if kind == "flatten":
        # memory order (C·H·W for NCHW, like torch; H·W·C for NHWC): no transpose
        return keras.layers.Flatten(data_format="channels_last", name=name)
    if kind == "dense":
        return keras.layers.Dense(layer[2] or classes, name=name)
    if kind == "dropout":
        return keras.layers.Dropout(layer[2], name=name)
    if kind == "block":
        return _block(layer, tuple(x.shape[1:]), first)
    raise HarnessError(f"unknown layer kind {kind!r} in the model zoo")


def _conv(layer: tuple[Any, ...], fmt: str) -> Any:
    _, name, out, k, stride, pad, bias = layer
    if pad == 0 or (stride == 1 and 2 * pad == k - 1):  # "same" is exactly this symmetric padding
        return keras.layers.Conv2D(out, k, strides=stride, padding="same" if pad else "valid",
                                   use_bias=bias, data_format=fmt, name=name)
    return keras.Sequential([
        keras.layers.ZeroPadding2D(pad, data_format=fmt, name=f"{name}_pad"),
        keras.layers.Conv2D(out, k, strides=stride, padding="valid", use_bias=bias, data_format=fmt, name=name),
    ], name=name)


def _bn(name: str, first: bool) -> Any:
    # torch BatchNorm2d momentum 0.1 (weight of the new batch) = keras momentum 0.9; eps 1e-5
    return keras.layers.BatchNormalization(axis=1 if first else -1, momentum=0.9, epsilon=1e-5, name=name)


def _block(layer: tuple[Any, ...], in_shape: tuple[int, ...], first: bool) -> Any:
    """A ResNet block as a small functional model: main path + shortcut, sum, ReLU."""
    _, name, kind, width, stride = layer
    in_ch = in_shape[0] if first else in_shape[-1]
    main, shortcut = block_layers(name, kind, in_ch, width, stride)
    inputs = keras.Input(shape=in_shape)
    fmt = "channels_first" if first else "channels_last"
    y, previous = inputs, None
    for sub in main:
        y = _unit(sub, y, 0, first=first, previous=previous)(y)
        previous = sub[0]
    s = inputs
    for sub in shortcut:
        s = (_conv(sub, fmt) if sub[0] == "conv" else _bn(sub[1], first))(s)
    out = keras.layers.ReLU(name=f"{name}_out")(keras.layers.Add(name=f"{name}_add")([y, s]))
    assert out.shape[1 if first else -1] == block_out_channels(kind, width)
    return keras.Model(inputs, out, name=name)


def trainable_parameters(model: Any) -> int:
    return sum(math.prod(v.shape) for v in model.trainable_variables)


def _net(params: dict[str, Any], dataset: Dataset) -> Network:
    """The cell's network: a CNN of the zoo, or a transformer (``_tf_transformers``; its units
    for the layer profile: ``_tf_transformers.units``)."""
    if is_transformer(params["model"]):
        try:
            return Network(transformers.build(params["model"], dataset.shape, dataset.classes, params["layout"]), [])
        except ValueError as exc:
            raise HarnessError(str(exc)) from exc
    return build(params["model"], dataset.shape, dataset.classes, params["layout"])


def _compile_mode(params: dict[str, Any]) -> str:
    mode = setting(params, "compile")
    return {"eager": "eager", "compiled": "compiled"}.get(mode, "graph")


def _trace(step: Any, params: dict[str, Any]) -> dict[str, Any] | None:
    """``compile = "compiled"``: trace the training step's graph before the first step (its
    input signature fixes every shape but the batch) and record the seconds.  XLA compiles the
    traced graph for each batch size at its first call: that lands in the first step, one of
    the warm-up steps (docs/TRANSFORMERS.md "Compilation")."""
    if setting(params, "compile") != "compiled":
        return None
    t0 = time.perf_counter()
    step.get_concrete_function()
    return {"mode": "compiled", "implementation": f"tf.function(jit_compile=True), XLA (tensorflow {tf.__version__})",
            "seconds": round(time.perf_counter() - t0, 6), "phase": "tracing; XLA compiles at each batch "
            "size's first step (a warm-up step)", "backward": True}


# --- training, evaluation, inference -------------------------------------------------------


def make_optimizer(params: dict[str, Any]) -> Any:
    """The optimizer with torch's constants; weight decay is added to the loss (coupled L2)."""
    lr, name = params["lr"], params["optimizer"]
    if name == "sgd":
        opt = keras.optimizers.SGD(learning_rate=lr, momentum=params["momentum"] or 0.0)
    elif name == "adam":
        opt = keras.optimizers.Adam(learning_rate=lr, epsilon=1e-8)
    elif name == "adadelta":
        opt = keras.optimizers.Adadelta(learning_rate=lr, rho=0.9, epsilon=1e-6)
    elif name == "rmsprop":
        opt = keras.optimizers.RMSprop(learning_rate=lr, rho=0.99, epsilon=1e-8)
    else:
        raise HarnessError(f"optimizer {name!r} is not supported by the tensorflow adapter")
    if params["precision"] == "fp16":
        opt = keras.optimizers.LossScaleOptimizer(opt)  # dynamic loss scaling
    return opt


def _keras2() -> bool:
    """Keras 2 (TensorFlow 2.12-2.15 through tf.keras, a cell's ``version``), not Keras 3."""
    return KERAS_VERSION.split(".")[0] == "2"


def _scale_loss(optimizer: Any, loss: Any) -> Any:
    """The loss the gradients are taken of: scaled by an fp16 loss-scale optimizer (Keras 3's
    ``scale_loss``; Keras 2's ``get_scaled_loss``), else itself."""
    if not _keras2():
        return optimizer.scale_loss(loss)
    return optimizer.get_scaled_loss(loss) if hasattr(optimizer, "get_scaled_loss") else loss


def _apply_gradients(optimizer: Any, grads: list[Any], variables: list[Any]) -> None:
    """One update (Keras 3's ``apply``, which unscales; Keras 2's ``apply_gradients``, after
    ``get_unscaled_gradients`` for a loss-scale optimizer)."""
    if not _keras2():
        optimizer.apply(grads, variables)
        return
    if hasattr(optimizer, "get_unscaled_gradients"):
        grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, variables))


def _signature(shape: tuple[int, ...], layout: str | None) -> Any:
    """The inputs' spec: images (NCHW unless the layout is NHWC), or token ids (batch, T)."""
    if len(shape) == 1:
        return tf.TensorSpec([None, shape[0]], tf.int32)
    c, h, w = shape
    return tf.TensorSpec([None, h, w, c] if layout == "nhwc" else [None, c, h, w], tf.float32)


def _label_spec(shape: tuple[int, ...]) -> Any:
    """The labels' spec: a class per image, or a next token per position."""
    return tf.TensorSpec([None, shape[0]] if len(shape) == 1 else [None], tf.int64)


def _per_sample(values: Any) -> Any:
    """A sequence's per-position values averaged to one per sample (a no-op for (batch,))."""
    return tf.reduce_mean(values, axis=-1) if len(values.shape) > 1 else values


def train_step(model: Any, optimizer: Any, weight_decay: float, shape: tuple[int, int, int], layout: str,
               strategy: Any = None, local_results: bool = False,
               input_gradient: bool = False, jit: bool = False) -> Callable[..., tuple[Any, ...]]:
    """``step(x, y) -> (summed loss, correct count)``: forward, loss, backward, update, one graph.

    With a MirroredStrategy each replica takes every n-th sample of the batch; the loss is
    divided by the whole batch so that the optimizer's all-reduce (sum) gives the mean.
    ``local_results`` (multi-worker): the loss and count of this worker's replica, not summed
    over the workers (which would be one more collective inside every step).
    ``input_gradient`` (``first_layer_backward = "full"``): the tape watches the input and
    the gradient is taken with respect to it too (the first layer's backward-data pass, which
    TensorFlow 1 always ran); a third output, 1 when that gradient has a non-zero element,
    consumes it, so that graph pruning cannot drop it.
    """
    variables = model.trainable_variables
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1

    def replica_step(x: Any, y: Any, total: Any) -> tuple[Any, ...]:
        if strategy is not None:
            ctx = tf.distribute.get_replica_context()
            x, y = x[ctx.replica_id_in_sync_group::replicas], y[ctx.replica_id_in_sync_group::replicas]
        with tf.GradientTape() as tape:
            if input_gradient:
                tape.watch(x)
            logits = tf.cast(model(x, training=True), tf.float32)
            loss_sum = tf.reduce_sum(_per_sample(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                                                   logits=logits)))
            loss = loss_sum / total
            if weight_decay:
                l2 = tf.add_n([tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in variables])
                loss = loss + 0.5 * weight_decay * l2 / replicas
            scaled = _scale_loss(optimizer, loss)
        if input_gradient:
            *grads, x_grad = tape.gradient(scaled, [*variables, x])
        else:
            grads = tape.gradient(scaled, variables)
        _apply_gradients(optimizer, grads, variables)
        correct = tf.reduce_sum(_per_sample(tf.cast(tf.equal(tf.argmax(logits, axis=-1), y), tf.float32)))
        if input_gradient:
            return loss_sum, correct, tf.cast(tf.reduce_any(tf.not_equal(x_grad, 0)), tf.int64)
        return loss_sum, correct

    @tf.function(input_signature=[_signature(shape, layout), _label_spec(shape)], jit_compile=jit or None)
    def step(x: Any, y: Any) -> tuple[Any, ...]:
        total = tf.cast(tf.shape(y)[0], tf.float32)
        if strategy is None:
            return replica_step(x, y, total)
        results = strategy.run(replica_step, args=(x, y, total))
        loss_sum, correct = results[:2]
        if local_results:
            out = (tf.add_n(strategy.experimental_local_results(loss_sum)),
                   tf.add_n(strategy.experimental_local_results(correct)))
        else:
            out = (strategy.reduce(tf.distribute.ReduceOp.SUM, loss_sum, axis=None),
                   strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None))
        if input_gradient:  # 1 when every replica of this process computed it
            out += (tf.reduce_min(tf.stack(strategy.experimental_local_results(results[2]))),)
        return out

    return step


def eval_step(model: Any, shape: tuple[int, ...], layout: str | None,
              jit: bool = False) -> Callable[[Any, Any], tuple[Any, Any]]:
    @tf.function(input_signature=[_signature(shape, layout), _label_spec(shape)], jit_compile=jit or None)
    def step(x: Any, y: Any) -> tuple[Any, Any]:
        logits = tf.cast(model(x, training=False), tf.float32)
        loss_sum = tf.reduce_sum(_per_sample(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)))
        return loss_sum, tf.reduce_sum(_per_sample(tf.cast(tf.equal(tf.argmax(logits, axis=-1), y), tf.float32)))

    return step


def predict_step(model: Any, shape: tuple[int, ...], layout: str | None, jit: bool = False) -> Callable[[Any], Any]:
    @tf.function(input_signature=[_signature(shape, layout)], jit_compile=jit or None)
    def step(x: Any) -> Any:
        return model(x, training=False)

    return step


def _train_epoch(step: Callable[..., tuple[Any, ...]], x: Any, y: Any, *, epoch: int, seed: int,
                 batch_size: int, budget: int | None, sync: Callable[[], None],
                 record: Callable[[StepSample], None],
                 ctx: distributed.Context | None = None, feed: Feed | None = None,
                 gradients: list[int] | None = None, fused: str = "forward+backward+update",
                 clock_for: Callable[[], StepClock | None] = lambda: None) -> tuple[int, float, float, float]:
    """One pass (or ``budget`` steps) over the shuffled data: (steps, loss, accuracy, seconds).

    Preloaded data: only the ``step`` call (and, on a GPU, the device sync) sits between the
    two clock readings.  A loader (``feed.pipeline``): the ``next`` of the epoch's tf.data
    iterator comes first, inside the clock.  The per-batch loss sums and correct counts stay
    tensors until the epoch ends.  A worker of a multi-worker cell (``ctx``): ``batch_size``
    is the global batch, every worker passes the same one and its replica takes its share;
    loss and accuracy are its own.  ``gradients`` (``first_layer_backward = "full"``): the
    step's third output (1: the input's gradient was computed) is summed into ``gradients[0]``.
    ``clock_for``: the next step's phase clock (``log.phase_clock``), None for a step that is
    not sampled; a loader's ``next`` is the ``input`` phase, and the ``step`` call is one phase
    named ``fused`` (``_fused_phases``: one graph, nothing in it can be told apart), read after
    the device wait on a GPU.
    """
    ctx = ctx or distributed.Context()
    t_epoch = time.perf_counter()
    n = int(y.shape[0])
    starts = distributed.batch_starts(n, batch_size, ctx.world, budget)
    if not starts and ctx.distributed:
        raise HarnessError(f"the training set ({n} samples) is smaller than the {ctx.world} workers")
    if feed is not None and feed.pipeline is not None:
        batches = feed.epoch(len(starts))
        fetch = lambda start, size: next(batches)  # noqa: E731  (the pipeline's batches are the starts')
    else:
        order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=[seed, epoch])
        xs, ys = tf.gather(x, order), tf.gather(y, order)
        fetch = None
    sums, counts, computed = [], [], []
    seen = 0
    for start, size in starts:
        clock = clock_for()
        if fetch is None:
            xb, yb = xs[start:start + size], ys[start:start + size]
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
        else:
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            xb, yb = fetch(start, size)
            if clock is not None:
                clock.mark("input")
        results = step(xb, yb)
        if clock is not None:
            clock.mark(fused)
        sync()
        t1 = time.perf_counter()
        record((epoch, t0, t1, ctx.recorded_images(size)))
        if clock is not None:
            clock.end()
        sums.append(results[0])
        counts.append(results[1])
        if gradients is not None:
            computed.append(results[2])
        seen += distributed.local_count(size, ctx.rank, ctx.world)
    loss_value = float(tf.add_n(sums).numpy()) if sums else math.nan
    correct_value = float(tf.add_n(counts).numpy()) if counts else 0.0
    if computed:
        gradients[0] += int(tf.add_n(computed).numpy())  # type: ignore[index]
    if feed is not None:
        feed.end_epoch()
    seconds = time.perf_counter() - t_epoch
    return len(sums), loss_value / seen, correct_value / seen, seconds


def _fused_phases(placement: Placement, feed: Feed) -> str:
    """The phases one call of the training step's ``tf.function`` runs, joined by ``+``: one
    graph holds forward, backward and update, so none of them can be timed alone.  A strategy
    (several GPUs, or the workers of a multi-worker cell) adds ``exchange``: the optimizer
    all-reduces the gradients inside the same graph.  A loader's batch on a GPU adds ``h2d``:
    the batch is a host tensor, copied to the GPU by the call."""
    names = ["forward", "backward"]
    if placement.gpus and feed.pipeline is not None:
        names.insert(0, "h2d")
    if placement.strategy is not None:
        names.append("exchange")
    return "+".join([*names, "update"])


def _calibrate(placement: Placement, ctx: distributed.Context, *, gpu: bool) -> dict[str, Any]:
    """Before training, every worker the same calls: the strategy's own all-reduce (SUM, a
    replica context's ``all_reduce`` in ``strategy.run`` in a ``tf.function``, as the
    optimizer's gradient all-reduce) of a float32 buffer on the replica's device, timed over
    ``phases.CALIBRATION_BYTES``, each call after an untimed one-number all-reduce (a
    barrier), followed by the device wait on a GPU (docs/MODEL.md).

    What it is: RING on the CPU (TensorFlow's ring reducer, the chunks sent between the
    workers' gRPC servers), NCCL on GPUs (its algorithm is NCCL's choice).  The exchange does
    not overlap the backward pass: with ``bytes_per_pack`` 0 (our ``CommunicationOptions``)
    the gradients are one pack, concatenated into one tensor before one all-reduce, which
    needs the last gradient."""
    strategy = placement.strategy

    def together() -> Any:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))

    signal = tf.function(lambda: strategy.run(together))

    def barrier() -> None:
        strategy.experimental_local_results(signal())[0].numpy()

    def prepare(size: int) -> Callable[[], None]:
        with tf.device(placement.device):  # the replica's device: no copy inside the timed call
            buffer = tf.ones([size // 4], tf.float32)

        def reduce() -> Any:
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, buffer)

        reduced = tf.function(lambda: strategy.run(reduce))

        def call() -> None:
            reduced()  # on the CPU the call returns when the all-reduce has run
            placement.sync()
        return call

    points = time_collective(prepare, barrier=barrier)
    return calibration(points, pattern="all-reduce" if gpu else "ring all-reduce",
                       transport="nccl" if gpu else "grpc", workers=ctx.world, overlaps_backward=False)


def _exchange_probe(model: Any, strategy: Any, x: Any, y: Any, batch: int, shape: tuple[int, int, int],
                    layout: str, log: EventLog, rounds: int = EXCHANGE_PROBE_ROUNDS) -> dict[str, Any]:
    """After training (every worker, the same calls): forward + backward of this worker's share
    of the first global batch, alone and followed by an all-reduce (SUM) of the gradients across
    the workers, ``rounds`` each, alternating, each after an untimed one-number all-reduce (a
    barrier), after one untimed call of each (tracing); no update.  The difference of the medians is the time the exchange adds to a step.
    TensorFlow exposes no hook into the optimizer's own all-reduce, so this is the only
    measure of it."""
    variables = model.trainable_variables
    checksum = float(sum(float(tf.reduce_sum(tf.abs(tf.cast(v, tf.float64))).numpy()) for v in variables))
    replicas = strategy.num_replicas_in_sync
    size = min(batch, int(y.shape[0]))
    xb, yb = x[:size], y[:size]

    def grads(xs: Any, ys: Any) -> Any:
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        xs, ys = xs[rid::replicas], ys[rid::replicas]
        with tf.GradientTape() as tape:
            logits = tf.cast(model(xs, training=True), tf.float32)
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys, logits=logits)) / size
        return tape.gradient(loss, variables)

    def alone(xs: Any, ys: Any) -> Any:
        return tf.add_n([tf.reduce_sum(g) for g in grads(xs, ys)])

    def exchanged(xs: Any, ys: Any) -> Any:
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads(xs, ys))
        return tf.add_n([tf.reduce_sum(g) for g in summed])

    def together() -> Any:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))

    calls = {False: tf.function(lambda a, b: strategy.run(alone, args=(a, b))),
             True: tf.function(lambda a, b: strategy.run(exchanged, args=(a, b)))}
    barrier = tf.function(lambda: strategy.run(together))
    for call in calls.values():  # trace
        strategy.experimental_local_results(call(xb, yb))[0].numpy()
    timed: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds * 2):
        with_exchange = (i % 2 == 0) == (i // 2 % 2 == 0)
        strategy.experimental_local_results(barrier())[0].numpy()  # start together (untimed)
        t0 = time.perf_counter()
        strategy.experimental_local_results(calls[with_exchange](xb, yb))[0].numpy()
        timed[with_exchange].append(time.perf_counter() - t0)
    synced, own = statistics.median(timed[True]), statistics.median(timed[False])
    steps = [t1 - t0 for _, t0, t1, _ in (log.steps[log.warmup_steps:] or log.steps)]
    step_median = statistics.median(steps) if steps else None
    added = synced - own
    return {"method": "probe after training: forward+backward of the worker's share with and without an "
                      "all-reduce (SUM, ring) of the gradients across the workers, difference of medians",
            "seconds_median": added, "fraction_of_step": added / step_median if step_median else None,
            "sync_pass_seconds_median": synced, "no_sync_pass_seconds_median": own,
            "added_seconds": added, "rounds": rounds, "weights_checksum": checksum}


def evaluate(step: Callable[[Any, Any], tuple[Any, Any]], x: Any, y: Any, batch_size: int,
             sync: Callable[[], None]) -> tuple[float, float, float]:
    """Mean cross-entropy and accuracy over the whole test set, and the seconds it took."""
    n = int(y.shape[0])
    t0 = time.perf_counter()
    sums, counts = [], []
    for start in range(0, n, batch_size):
        loss_sum, correct = step(x[start:start + batch_size], y[start:start + batch_size])
        sums.append(loss_sum)
        counts.append(correct)
    sync()
    loss_value, correct_value = float(tf.add_n(sums).numpy()), float(tf.add_n(counts).numpy())
    seconds = time.perf_counter() - t0
    return loss_value / n, correct_value / n, seconds


def _layer_op(unit: Any, x: Any, upstream: Any, *, first: bool, training: bool) -> LayerOp:
    """Forward and backward of one layer, each a ``tf.function``.  The backward replays the
    tape recorded once here; as a graph, the gradients nobody asks for are pruned: eagerly,
    TensorFlow's Conv2D gradient always computes the input gradient too, so the first layer's
    backward would include it even when ``first`` (the input needs none) says skip it."""
    forward = tf.function(lambda: unit(x, training=training))
    if not training:
        return LayerOp(forward=forward)
    with tf.GradientTape(persistent=True) as tape:
        if not first:  # (token ids, the first unit's input, are integers: nothing to watch)
            tape.watch(x)
        y = unit(x, training=True)
    sources = ([] if first else [x]) + list(unit.trainable_variables)
    if not sources:  # nothing to differentiate (the first layer without weights): nothing to time
        return LayerOp(forward=forward, backward=lambda: None)
    return LayerOp(forward=forward, backward=tf.function(lambda: tape.gradient(y, sources, output_gradients=upstream)))


# --- data ------------------------------------------------------------------------------


class Feed:
    """What feeds the training steps (``input_pipeline``).

    ``preloaded``: ``x`` / ``y`` are the normalised training tensors; each epoch gathers them
    in a ``stateless_shuffle`` order and slices batches.  ``loader``: ``x`` is the stored uint8
    images, and ``pipeline`` a tf.data pipeline over them —
    ``from_tensor_slices`` → ``shuffle`` (the whole split, seeded, reshuffled every epoch) →
    ``map`` (the per-sample conversion: float, /255, mean 0.5 / std 0.5, NHWC when asked) →
    ``batch`` → ``prefetch``.  ``loader_workers`` N > 0: the map runs on N threads
    (``num_parallel_calls = N``, order kept), in a private pool of N threads
    (``threading.private_threadpool_size``), and ``prefetch(2·N)`` keeps 2 batches per
    thread ready (a torch DataLoader's ``prefetch_factor``); 0: in the training process's
    call — a sequential map, no prefetch, tf.data's autotuning and injected prefetch off.
    A fixed, stated parallelism rather than AUTOTUNE, so that cells compare.
    Each epoch's iterator is made before its first step; each ``next`` runs inside the
    step's clock.
    """

    def __init__(self, params: dict[str, Any], split: Split, shape: tuple[int, int, int], batch: int) -> None:
        self.layout, self.shape = params["layout"], shape
        self.workers = setting(params, "loader_workers")
        self.pipeline: Any = None
        self.batches = 0
        if setting(params, "input_pipeline") != "loader":
            self.x, self.y = tensors(split, shape, params["layout"])
            return
        with tf.device("/CPU:0"):  # the pipeline runs on the host, whatever the model's device
            self.x, self.y = pixels(split, shape)
            ds = tf.data.Dataset.from_tensor_slices((self.x, self.y))
            ds = ds.shuffle(split.count, seed=params["seed"], reshuffle_each_iteration=True)
            ds = ds.map(self._convert, num_parallel_calls=self.workers or None, deterministic=True)
            ds = ds.batch(batch)
            if self.workers:
                ds = ds.prefetch(2 * self.workers)
            options = tf.data.Options()
            options.deterministic = True
            if self.workers:
                options.threading.private_threadpool_size = self.workers
            else:
                options.autotune.enabled = False
                options.experimental_optimization.inject_prefetch = False
            self.pipeline = ds.with_options(options)

    def _convert(self, image: Any, label: Any) -> tuple[Any, Any]:
        x = (tf.cast(image, tf.float32) / 255.0 - 0.5) / 0.5
        if self.layout == "nhwc":
            x = tf.transpose(x, (1, 2, 0))
        return x, label

    def epoch(self, steps: int) -> Any:
        """The epoch's first ``steps`` batches, as an iterator whose ``next`` fetches one."""
        with tf.device("/CPU:0"):
            self._iterator = iter(self.pipeline.take(steps))
        return self._fetch(self._iterator)

    def _fetch(self, iterator: Any) -> Any:
        for xb, yb in iterator:
            self.batches += 1
            yield xb, yb

    def end_epoch(self) -> None:
        """After an epoch's steps: let its iterator go (and the pipeline's threads with it)."""
        self._iterator = None

    def dataset_ops(self) -> list[str] | None:
        """The tf.data ops of the pipeline that ran, from its serialized graph (a private
        TensorFlow method: None where it is missing)."""
        try:
            graph = tf.compat.v1.GraphDef()
            graph.ParseFromString(self.pipeline._as_serialized_graph().numpy())
        except (AttributeError, TypeError, ValueError):
            return None
        return [node.op for node in graph.node if "Dataset" in node.op]

    def probe_batch(self, size: int) -> tuple[Any, Any]:
        """Normalised tensors holding at least the first ``size`` samples (the exchange probe)."""
        if self.pipeline is None:
            return self.x, self.y
        x = (tf.cast(self.x[:size], tf.float32) / 255.0 - 0.5) / 0.5
        if self.layout == "nhwc":
            x = tf.transpose(x, (0, 2, 3, 1))
        return x, self.y[:size]

    def describe(self) -> dict[str, Any]:
        """The summary's ``input_pipeline``: what really fed the steps."""
        if self.pipeline is None:
            return {"kind": "preloaded"}
        return {"kind": "loader", "implementation": "tf.data: from_tensor_slices, shuffle, map, batch"
                + (", prefetch" if self.workers else ""), "workers": self.workers,
                "num_parallel_calls": self.workers or None, "prefetch": 2 * self.workers or None,
                "element_spec": str(self.pipeline.element_spec), "batches": self.batches,
                "dataset_ops": self.dataset_ops()}


def pixels(split: Split, shape: tuple[int, int, int]) -> tuple[Any, Any]:
    """The split as it is stored: uint8 images (N, C, H, W) and int64 labels."""
    images = tf.reshape(tf.io.decode_raw(tf.constant(bytes(split.images)), tf.uint8), (split.count, *shape))
    y = tf.io.decode_raw(tf.constant(split.labels.tobytes()), tf.int64, little_endian=sys.byteorder == "little")
    return tf.identity(images), tf.identity(y)



def tensors(split: Split, shape: tuple[int, int, int], layout: str) -> tuple[Any, Any]:
    """float32 images normalised to [-1, 1] (NCHW or NHWC) and int64 labels, on the current device;
    token data: int32 inputs and int64 targets, (count, seq_len) each."""
    if isinstance(split, TokenSplit):
        import numpy as np
        xs, ys = split.arrays(np)
        return tf.identity(tf.constant(xs, tf.int32)), tf.identity(tf.constant(ys.astype(np.int64)))
    pixels = tf.io.decode_raw(tf.constant(bytes(split.images)), tf.uint8)
    x = tf.reshape(pixels, (split.count, *shape))
    x = (tf.cast(x, tf.float32) / 255.0 - 0.5) / 0.5
    if layout == "nhwc":
        x = tf.transpose(x, (0, 2, 3, 1))
    y = tf.io.decode_raw(tf.constant(split.labels.tobytes()), tf.int64, little_endian=sys.byteorder == "little")
    return tf.identity(x), tf.identity(y)


def _js(flag: bool) -> str:
    return "true" if flag else "false"
