"""JAX adapter (framework ``jax``): Flax (linen) networks from ``models.py``, optax optimizers,
one jitted training step, timed per call with ``block_until_ready``.

JAX dispatches asynchronously: a jitted call returns before the device has run it.  Every
timed region therefore ends with ``jax.block_until_ready`` on the step's outputs (its loss,
correct count and flag: the new state is an output of the same execution, ready with them),
and the batch a step reads, and its step counter, are made ready *before* the clock starts.
XLA compiles one program per input shape: the programs of every batch shape a run meets (the
full batch and the epoch's last partial one) are compiled ahead of time
(``jit(...).lower(...).compile()``), before the first timed step, so no step's time holds a
compilation.

Phases (sampled steps, ``phase_sampling``).  The jitted step is one XLA program: forward,
backward, the all-reduce of a mesh and the update are recorded together as
``forward+backward+update`` (``forward+backward+exchange+update`` on a mesh), never split.
With ``input_pipeline = "loader"`` the fetch (``input``) and the ``device_put`` (``h2d``)
are inside the clock and marked apart; preloaded batches are put on the device before the
clock starts.  The clock needs no wait of its own: every mark follows a
``block_until_ready`` the step makes anyway, sampled or not.  A multi-worker cell times the
same ``psum`` its step all-reduces with before training (``_calibrate``).

Threads.  XLA's CPU runtime runs its work on one intra-op pool (threads named
``tf_XLAEigen``) sized from the CPUs the process may run on (``tsl::port::MaxParallelism``,
the affinity mask); ``OMP_NUM_THREADS``, ``--xla_cpu_multi_thread_eigen=false`` and the
``intra_op_parallelism_threads`` flag change nothing (measured: docs/frameworks/jax.md).  So
``threads = N`` narrows this process's CPU affinity to N of its CPUs *before* JAX starts its
backend (the same switch as ``taskset`` or a container's ``--cpuset-cpus``), and the probe
counts the pool's threads.  There is no inter-op pool: ``interop_threads`` is refused.

oneDNN.  XLA's CPU backend calls oneDNN's gemm for dot products whatever
``--xla_cpu_use_onednn`` says (the oneDNN check counts the same ``gemm_api`` executions
either way) and runs convolutions in Eigen: there is no switch that turns oneDNN off, so
``onednn = false`` is refused at plan time (framework.toml).

Layout.  The zoo's layers are written with ``lax`` convolution / reduce-window primitives and
XLA dimension numbers ``NCHW``/``OIHW`` or ``NHWC``/``HWIO`` (Flax's own ``nn.Conv`` is NHWC
only); the layout is what XLA is handed — its CPU compiler may still choose its own physical
layout for a fused program.  Flatten keeps memory order (C·H·W for NCHW, H·W·C for NHWC).

Precision.  bf16 / fp16: mixed precision — fp32 master weights and optimizer state, the
forward and backward passes in the low precision (weights and inputs cast), the loss and
BatchNorm statistics in fp32; fp16 with dynamic loss scaling (scale 2^15, halved and the
update skipped on a non-finite gradient, doubled after 2,000 finite steps).  tf32 (GPU only):
``jax_default_matmul_precision = "tensorfloat32"``; fp32 on a GPU sets ``"highest"`` (JAX
allows TF32 for fp32 matrix products on Ampere+ by default).  ``conv_algo`` on a GPU is
``--xla_gpu_autotune_level`` (0: XLA's heuristic choice; 4: autotuning, XLA's default).

Several devices (``gpus`` > 1) and multi-worker cells (``jax.distributed`` with gloo CPU
collectives, one process per worker, started by the launcher): one ``shard_map``-ed step over
a mesh of the devices (one per worker), each device taking every ``world``-th sample of the
same global batch, the gradients summed with ``psum`` (an all-reduce) and the same update
applied everywhere.  Equal shares are a rule of a mesh: a global batch that does not split
evenly is padded per worker with copies of its own samples of weight 0 (the loss and the
gradients leave them out; BatchNorm's batch statistics of that one step see them).
BatchNorm running statistics are averaged over the workers after each step.

Fidelity to the framework-neutral definitions (docs/frameworks/jax.md): BatchNorm momentum
0.9 / eps 1e-5 (torch's 0.1); max-pool pads with -inf; Flax's default initialisers (LeCun
normal weights, zero biases); ``weight_decay`` is coupled L2 (``0.5·wd·Σw²`` in the loss) as
in torch; optimizer constants follow torch (Adam eps 1e-8, Adadelta rho 0.9 eps 1e-6, RMSprop
decay 0.99 eps 1e-8 outside the square root).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import HarnessError
from .. import distributed
from ..datasets import Dataset, Split, prefetched
from ..events import EventLog, StepSample
from ..layers import LayerOp, LayerOps
from ..models import MODELS as ZOO
from ..models import TRANSFORMERS, block_layers, is_language_model, is_transformer, model_flops, vit_patches
from ..phases import StepClock, calibration, time_collective
from ..probe import thread_census
from ..spec import model_problem, setting
from ..text import TokenSplit
from . import TrainOutcome
from . import _jax_transformers as transformers

NAME = "jax"
POOL_THREAD = "tf_XLAEigen"  # the name XLA's CPU intra-op pool gives its threads
EXCHANGE_PROBE_ROUNDS = 8
LOSS_SCALE = 2.0 ** 15
LOSS_SCALE_PERIOD = 2000

# Imported by configure(), after the CPU affinity and the environment switches are set.
jax: Any = None
jnp: Any = None
np: Any = None
nn: Any = None
optax: Any = None
_STATE: dict[str, Any] = {}  # what configure did: the affinity before it, XLA_FLAGS, the coordinator


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    """What JAX cannot run (the host refuses the same through framework.toml)."""
    model = params["model"]
    if model not in ZOO and not is_transformer(model):
        return f"[params -> model] unknown model {model!r} for jax (known: {', '.join((*ZOO, *TRANSFORMERS))})"
    if setting(params, "compile") == "eager":
        return ("[params -> compile] JAX compiles every step with XLA (jax.jit): it has no eager mode that "
                "matrun measures; leave compile out (or \"compiled\")")
    if is_transformer(model) and (distributed.multi_process(params) or (params["gpus"] or 1) > 1):
        return ("[params -> model] the jax transformers run on one device in one process here (their "
                "sharded step is not written yet): use workers = 1, gpus = 1")
    if params["device"] == "cpu" and params["precision"] == "tf32":
        return "[params -> precision] TF32 is a feature of NVIDIA Ampere and later GPUs"
    if not params["onednn"]:
        return ("[params -> onednn] XLA's CPU backend has no switch that turns oneDNN off (its dot products "
                "call oneDNN's gemm whatever --xla_cpu_use_onednn says)")
    if params["interop_threads"] != "unset":
        return "[params -> interop_threads] XLA's CPU runtime has one thread pool (intra-op); there is no inter-op pool"
    return model_problem(params)  # the input too small for the model (load_spec checks it too)


def configure(params: dict[str, Any]) -> None:
    """CPU affinity (threads), XLA flags and platform, then the import; then the numerics
    switches and, for a worker of a multi-worker cell, ``jax.distributed``."""
    global jax, jnp, np, nn, optax
    ctx = distributed.current()
    before = sorted(os.sched_getaffinity(0))
    _STATE["affinity_before"] = before
    _STATE["affinity_narrowed"] = False
    if isinstance(params["threads"], int) and params["threads"] < len(before):
        n = params["threads"]
        start = 0
        # A worker without a cpuset of its own takes its slice of the cell's CPUs.
        if ctx.distributed and not params.get("cpuset") and len(before) >= ctx.local_world * n:
            start = ctx.local_rank * n
        os.sched_setaffinity(0, before[start:start + n])
        _STATE["affinity_narrowed"] = True
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_gpu_autotune_level")]
    if params["device"] == "gpu":
        flags.append(f"--xla_gpu_autotune_level={4 if params['conv_algo'] == 'autotune' else 0}")
    if flags:
        os.environ["XLA_FLAGS"] = " ".join(flags)
    _STATE["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    if params["device"] == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"  # a CUDA build must not claim a GPU for a cpu cell
    import numpy
    import jax as jax_module
    import jax.numpy as jnp_module
    import flax.linen as linen
    import optax as optax_module

    jax, jnp, np, nn, optax = jax_module, jnp_module, numpy, linen, optax_module
    if params["device"] == "gpu":
        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if params["precision"] == "tf32"
                          else "highest")
    if ctx.distributed and "coordinator" not in _STATE:
        address = os.environ.get("JAX_COORDINATOR_ADDRESS")
        if not address:
            raise HarnessError("a multi-worker jax cell needs JAX_COORDINATOR_ADDRESS (the launcher sets it)")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        _gloo_on_interface(os.environ.get("GLOO_SOCKET_IFNAME"))
        # the coordinator's gRPC service listens on the rendezvous address only, never on every interface
        jax.distributed.initialize(coordinator_address=address, num_processes=ctx.world, process_id=ctx.rank,
                                   initialization_timeout=600, coordinator_bind_address=address)
        _STATE["coordinator"] = address


def _autotune_level(flags: str) -> int | None:
    """The last ``--xla_gpu_autotune_level=N`` in ``flags`` (XLA reads the last), or None."""
    level = None
    for flag in flags.split():
        name, _, value = flag.partition("=")
        if name == "--xla_gpu_autotune_level":
            try:
                level = int(value)
            except ValueError:
                level = None
    return level


def _gloo_on_interface(interface: str | None) -> None:
    """Make the CPU backend's gloo collectives bind to ``interface`` (the worker plan's, ``lo`` on
    one host).  JAX's own CPU client creates them without one, and gloo then resolves the host
    name, which fails where the host name has no address (a container with ``--network none``:
    ``gloo/transport/tcp/device.cc:99 rv == 0. -3 vs 0``).  JAX has no public switch for it: the
    CPU backend's factory is registered again, before the backend starts, with the collectives
    made on that interface (``jax._src.xla_bridge``; jaxlib 0.10.2)."""
    if not interface:
        return
    try:
        from jax._src import distributed as jax_distributed
        from jax._src import xla_bridge
        from jax._src.lib import _jax
    except ImportError as exc:  # a JAX whose internals moved: fail clearly, not in gloo
        raise HarnessError(f"cannot bind JAX's gloo collectives to {interface}: {exc}") from exc

    def factory() -> Any:
        collectives = _jax.make_gloo_tcp_collectives(distributed_client=jax_distributed.global_state.client,
                                                     interface=interface)
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)
    _STATE["gloo_interface"] = interface


def probe(params: dict[str, Any]) -> dict[str, Any]:
    import jaxlib

    jnp.ones(()).block_until_ready()  # start the backend (its thread pool) so it can be counted
    backend = jax.default_backend()
    devices = jax.devices()
    census = thread_census()
    pool = census.get(POOL_THREAD)
    affinity_now = sorted(os.sched_getaffinity(0))
    used = "gpu" if backend in ("gpu", "cuda", "rocm") else "cpu"
    in_force: dict[str, Any] = {
        "threads": pool if used == "cpu" else None,
        "threads_source": "XLA CPU intra-op pool: tf_XLAEigen threads counted; sized from the CPU affinity",
        "cpus_allowed": len(affinity_now),
        "affinity_before_threads": _STATE.get("affinity_before"),
        "affinity_narrowed": _STATE.get("affinity_narrowed"),
        "interop_threads": None,
        "onednn": None,
        "onednn_source": "no switch: XLA's CPU dot products call oneDNN's gemm (the oneDNN check counts them)",
        "device": used,
        "backend": backend,
        "devices": [str(d) for d in devices],
        "device_kinds": sorted({d.device_kind for d in devices}),
        "process_count": jax.process_count(),
        "platform_version": _platform_version(devices),
        "layout": params["layout"],
        "precision": params["precision"],
        "matmul_precision": str(_config("jax_default_matmul_precision")),
        "xla_flags": _STATE.get("xla_flags", ""),
        "jaxlib_version": jaxlib.__version__,
        "flax_version": _version("flax"),
        "optax_version": _version("optax"),
        "x64": bool(_config("jax_enable_x64")),
        "thread_census": census,
        "compile": "compiled",  # always: every step is a jitted XLA program
    }
    if is_transformer(params["model"]):
        fused = setting(params, "attention") == "fused"  # Flax's own attention is the explicit einsum
        in_force["attention"] = "fused" if fused else "explicit"
        if fused:
            in_force["attention_kernel"] = transformers.attention_kernel(
                used, compute_dtype(params["precision"]), params["model"], _tokens(params))
    ctx = distributed.current()
    if ctx.distributed:
        in_force.update(rank=ctx.rank, world_size=ctx.world,
                        cpu_collectives=str(_config("jax_cpu_collectives_implementation")),
                        coordinator=_STATE.get("coordinator"), gloo_interface=_STATE.get("gloo_interface"))
    mismatches = []
    if params["device"] == "gpu":
        level = _autotune_level(os.environ.get("XLA_FLAGS", ""))
        in_force["xla_gpu_autotune_level"] = level  # None: not in XLA_FLAGS (XLA's own default, 4)
        in_force["conv_algo"] = "heuristic" if level == 0 else "autotune"
        if in_force["conv_algo"] != params["conv_algo"]:
            mismatches.append(f"conv_algo: asked {params['conv_algo']}, in force {in_force['conv_algo']} "
                              f"(--xla_gpu_autotune_level={level if level is not None else 'unset'})")
    if isinstance(params["threads"], int) and used == "cpu" and pool != params["threads"]:
        mismatches.append(f"threads: asked {params['threads']}, in force {pool}")
    if params["device"] != used:
        mismatches.append(f"device: asked {params['device']}, in force {used} (backend {backend})")
    elif used == "gpu" and params["gpus"] and params["gpus"] > len(jax.local_devices()):
        mismatches.append(f"gpus: asked {params['gpus']}, visible {len(jax.local_devices())}")
    return {
        "framework_version": jax.__version__,
        "build": f"jax {jax.__version__}; jaxlib {jaxlib.__version__}; backend {backend} "
                 f"({_platform_version(devices)}); flax {_version('flax')}; optax {_version('optax')}",
        "in_force": in_force,
        "mismatches": mismatches,
        # the affinity the cell was given (threads narrow it): what a cpuset is checked against
        "cell_affinity": _STATE.get("affinity_before"),
    }


_COMPILE_TIMES: list[float] | None = None


def _compile_watch() -> list[float]:
    """When each XLA compilation of this process ended (``time.perf_counter()``): a listener on
    JAX's ``/jax/core/compile/backend_compile_duration`` event, registered once per process."""
    global _COMPILE_TIMES
    if _COMPILE_TIMES is None:
        times: list[float] = []

        def heard(event: str, _seconds: float, **_kwargs: Any) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                times.append(time.perf_counter())

        jax.monitoring.register_event_duration_secs_listener(heard)
        _COMPILE_TIMES = times
    return _COMPILE_TIMES


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    watch = _compile_watch()
    ctx = distributed.current()
    place = placement(params)
    batch = distributed.global_batch(params) if ctx.distributed else params["batch_size"]
    net = _net(params, dataset)
    state = init_state(net, params, dataset.shape, place)
    log.emit("model", name=params["model"], parameters=parameter_count(state.params),
             flops=model_flops(params["model"], dataset.shape, dataset.classes))
    feed = Feed(params, dataset.train, dataset.shape, place)
    x_test, y_test = arrays(dataset.test, dataset.shape, params["layout"])
    held = arrays(dataset.validation, dataset.shape, params["layout"]) if dataset.validation and ctx.chief else None
    full = setting(params, "first_layer_backward") == "full"
    trainer = Trainer(net, params, state, place, input_gradient=full)
    calibrated = _calibrate(trainer, ctx) if ctx.distributed else None  # the workers have joined (configure)
    evaluator = Evaluator(net, params)
    iterations, patience = params["iterations"], setting(params, "early_stopping")
    gradients = [0]
    notes = ["steps are jitted XLA programs compiled ahead of the first step for every batch shape; "
             "time_to_first_step and the first epoch's seconds include that compilation"]

    def outcome(**more: Any) -> TrainOutcome:
        return TrainOutcome(notes=notes, model=Trained(net, trainer.state, place), input_gradient_steps=gradients[0],
                            input_pipeline=feed.describe(), peak_device_memory_bytes=place.peak_memory(),
                            compilation=trainer.compilation(), compile_times=watch, **more)

    epoch, done = 0, 0
    while (done < iterations) if iterations else (epoch < params["epochs"]):
        budget = iterations - done if iterations else None
        starts = distributed.batch_starts(len(feed.y), batch, ctx.world, budget)
        if not starts and ctx.distributed:
            raise HarnessError(f"the training set ({len(feed.y)} samples) is smaller than the {ctx.world} workers")
        # no device wait for the clock: each mark follows the step's own block_until_ready
        steps, loss, accuracy, seconds = train_epoch(trainer, feed, starts, epoch=epoch, seed=params["seed"],
                                                     record=log.steps.append, ctx=ctx,
                                                     gradients=gradients if full else None,
                                                     clock_for=lambda: log.phase_clock(None))
        done += steps
        validation = None
        if ctx.chief:
            local = trainer.local_state()
            test_loss, test_accuracy, test_seconds = evaluator.run(local, x_test, y_test, params["eval_batch_size"])
            if held:
                validation = evaluator.run(local, *held, params["eval_batch_size"])
        else:
            test_loss = test_accuracy = test_seconds = None
        log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                  test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                  validation=validation)
        if not math.isfinite(loss):
            notes.append(f"training loss became {loss} in epoch {epoch}; stopped")
            return outcome(diverged=True, exchange=_exchange(trainer, feed, batch, log, ctx, calibrated))
        if log.should_stop(patience):
            return outcome(stopped_early=True, exchange=_exchange(trainer, feed, batch, log, ctx, calibrated))
        epoch += 1
    return outcome(exchange=_exchange(trainer, feed, batch, log, ctx, calibrated))


def infer(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    """Forward passes over the test split in order (cycling), timed per batch."""
    watch = _compile_watch()
    place = placement(params)
    net = _net(params, dataset)
    state = init_state(net, params, dataset.shape, place)
    log.emit("model", name=params["model"], parameters=parameter_count(state.params),
             flops=model_flops(params["model"], dataset.shape, dataset.classes))
    x, _ = arrays(dataset.test, dataset.shape, params["layout"])
    dtype = compute_dtype(params["precision"])
    device = place.devices[0]
    variables = jax.device_put(state.variables(), device)

    def forward(variables: Any, xb: Any) -> Any:
        return net.apply(_cast(variables, dtype), _input(net, xb, dtype), train=False)

    jitted = jax.jit(forward)
    n, batch = len(x), params["batch_size"]
    starts = list(range(0, n, batch))
    batches = [jax.device_put(x[s:s + batch], device) for s in starts]
    t_compile = time.perf_counter()
    compiled = {b.shape[0]: jitted.lower(variables, b).compile() for b in batches[:1] + batches[-1:]}
    compilation = {"mode": "compiled", "implementation": f"jax.jit (XLA, jax {jax.__version__})",
                   "seconds": round(time.perf_counter() - t_compile, 6), "batch_sizes": sorted(compiled, reverse=True),
                   "backward": False}
    total = params["iterations"] or len(starts)
    t_all = time.perf_counter()
    for index in range(total):
        xb = batches[index % len(starts)]
        t0 = time.perf_counter()
        jax.block_until_ready(compiled[xb.shape[0]](variables, xb))
        t1 = time.perf_counter()
        log.steps.append((index // len(starts), t0, t1, xb.shape[0]))
    seconds = time.perf_counter() - t_all
    return TrainOutcome(model=Trained(net, state, place), inference_seconds=seconds,
                        peak_device_memory_bytes=place.peak_memory(), compilation=compilation, compile_times=watch,
                        notes=["forward passes are one jitted XLA program per batch shape, compiled before the "
                               "first timed batch"])


def layer_ops(params: dict[str, Any], dataset: Dataset, model: Any) -> LayerOps:
    """Each layer of a sequential network as its own jitted program on one real batch.

    XLA fuses a whole step into one program, so the time of a layer inside it cannot be read
    off: here every layer is compiled and timed alone (unfused), forward on the real output of
    the layer before it, backward as the layer's VJP (residuals computed once, untimed) applied
    to the real upstream gradient.  The sum of these times is not the fused step's time; the
    summary says so."""
    trained: Trained = model
    if is_transformer(params["model"]):
        return _transformer_layer_ops(params, dataset, trained)
    net = trained.net
    training, x, y, device, dtype, state = _profile_batch(params, dataset, trained)
    variables = jax.device_put(_cast(state.variables(), dtype), device)
    x, y = jax.device_put(x.astype(dtype), device), jax.device_put(y, device)
    units = net.units()
    rng = jax.random.PRNGKey(params["seed"])

    def run_unit(unit: Any, name: str, v: Any, inp: Any) -> Any:
        return _unit_apply(unit, {k: v[k][name] for k in v if name in v[k]}, inp, training, rng)

    inputs, h = [], x
    for name, unit in units:
        inputs.append(h)
        h = run_unit(unit, name, variables, h)
    upstream: list[Any] = [None] * len(units)
    if training:
        def loss_from(index: int, out: Any) -> Any:
            for name, unit in units[index + 1:]:
                out = run_unit(unit, name, variables, out)
            return optax.softmax_cross_entropy_with_integer_labels(out.astype(jnp.float32), y).mean()

        outs = [run_unit(unit, name, variables, inputs[i]) for i, (name, unit) in enumerate(units)]
        upstream = [jax.grad(lambda o, i=i: loss_from(i, o))(outs[i]) for i in range(len(units))]
    skip_first = setting(params, "first_layer_backward") == "skip"
    ops = []
    for i, (name, unit) in enumerate(units):
        sub = {k: variables[k][name] for k in variables if name in variables[k]}
        ops.append(_layer_op(unit, sub, inputs[i], upstream[i], first=i == 0 and skip_first, training=training,
                             rng=rng))
    return LayerOps(ops=ops, images=int(x.shape[0]), notes=[
        "layer profile (jax): each layer was compiled and timed as its own XLA program (unfused); the training "
        "step is one fused program, so the layers' times do not add up to the step's"])


def _profile_batch(params: dict[str, Any], dataset: Dataset, trained: Trained) -> tuple[bool, Any, Any, Any, Any, State]:
    """What a layer profile times on: whether the cell trains, one batch of its split (inputs
    and labels as numpy arrays), the device, the compute dtype and this process's state."""
    training = params["mode"] != "inference"
    split = dataset.train if training else dataset.test
    x, y = arrays(split.head(params["batch_size"]), dataset.shape, params["layout"])
    state = trained.state if not isinstance(trained.state, Sharded) else trained.state.local()
    return training, x, y, trained.place.devices[0], compute_dtype(params["precision"]), state


def _transformer_layer_ops(params: dict[str, Any], dataset: Dataset, trained: Trained) -> LayerOps:
    """A transformer's units (``_jax_transformers.TransformerNetwork.transformer_units``) on one
    real batch, each its own jitted program as ``layer_ops`` does for a CNN's layers: forward
    on the unit's real input, backward as its VJP applied to the real gradient of the loss with
    respect to its output (the residual additions between units are not timed).  The first
    unit (the embedding) takes no input gradient: token ids have none, and torch's profile
    leaves the images' out too."""
    net = trained.net
    training, x, y, device, dtype, state = _profile_batch(params, dataset, trained)
    weights = jax.device_put(_cast(state.params, dtype), device)
    x, y = jax.device_put(_input(net, x, dtype), device), jax.device_put(y, device)
    units = net.transformer_units(weights)
    subtrees = [unit.params for unit in units]
    inputs, outputs = jax.jit(lambda p, xin: transformers.unit_inputs(units, p, xin))(subtrees, x)
    upstream: list[Any] = [None] * len(units)
    if training:
        def loss(deltas: list[Any], p: list[Any], xin: Any, target: Any) -> Any:
            logits = transformers.unit_inputs(units, p, xin, deltas)[1][-1].astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()

        # d loss / d (a zero added to each output) is d loss / d output, all in one pass
        upstream = jax.jit(jax.grad(loss))([jnp.zeros_like(o) for o in outputs], subtrees, x, y)
    ops = [_fn_op(unit.apply, unit.params, inputs[i], upstream[i], first=i == 0, training=training)
           for i, unit in enumerate(units)]
    return LayerOps(ops=ops, images=int(x.shape[0]), notes=[
        "layer profile (jax): each unit was compiled and timed as its own XLA program (unfused), the residual "
        "additions between them untimed; the training step is one fused program, so the units' times do not "
        "add up to the step's"])


def _unit_apply(unit: Any, variables: Any, x: Any, training: bool, rng: Any) -> Any:
    """One unit's output (training: dropout on, BatchNorm on the batch's statistics)."""
    if not training:
        return unit.apply(variables, x, train=False)
    if "batch_stats" in variables:
        return unit.apply(variables, x, train=True, rngs={"dropout": rng}, mutable=["batch_stats"])[0]
    return unit.apply(variables, x, train=True, rngs={"dropout": rng})


def _layer_op(unit: Any, sub: Any, inp: Any, grad: Any, *, first: bool, training: bool, rng: Any) -> LayerOp:
    params = sub.get("params", {})
    rest = {k: v for k, v in sub.items() if k != "params"}

    def apply(p: Any, x: Any) -> Any:
        return _unit_apply(unit, {"params": p, **rest}, x, training, rng)

    return _fn_op(apply, params, inp, grad, first=first, training=training)


def _fn_op(apply: Callable[[Any, Any], Any], params: Any, inp: Any, grad: Any, *, first: bool,
           training: bool) -> LayerOp:
    """``apply(params, inp)`` as its own jitted program (compiled here, before any timing);
    backward: its VJP (residuals computed once, untimed) applied to ``grad``, jitted too —
    with respect to ``params`` and, unless ``first``, the input."""
    forward_jit = jax.jit(apply)
    forward_jit.lower(params, inp).compile()

    def forward() -> Any:
        return jax.block_until_ready(forward_jit(params, inp))

    if not training:
        return LayerOp(forward=forward)
    has_params = bool(jax.tree_util.tree_leaves(params))
    if first and not has_params:
        return LayerOp(forward=forward, backward=lambda: None)
    if first:
        _, vjp = jax.vjp(lambda p: apply(p, inp), params)
    else:
        _, vjp = jax.vjp(apply, params, inp)
    backward_jit = jax.jit(lambda fn, g: fn(g))

    def backward() -> Any:
        return jax.block_until_ready(backward_jit(vjp, grad))

    return LayerOp(forward=forward, backward=backward)


# --- what is in force --------------------------------------------------------------------


def _config(name: str) -> Any:
    try:
        return jax.config.read(name)
    except (AttributeError, KeyError):
        return getattr(jax.config, name, None)


def _platform_version(devices: list[Any]) -> str | None:
    try:
        return str(devices[0].client.platform_version)
    except (AttributeError, IndexError):
        return None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001  (a missing distribution is "unknown", never a failure)
        return None


# --- devices ---------------------------------------------------------------------------


@dataclass
class Placement:
    """The devices a cell computes on: one, or a mesh (``gpus`` > 1, or one per worker)."""

    devices: list[Any]
    mesh: Any = None  # jax.sharding.Mesh over ``devices`` (axis "data"), None for one device
    gpu: bool = False

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def peak_memory(self) -> int | None:
        """Peak bytes in use, summed over this process's GPUs; None on the CPU or if unknown."""
        if not self.gpu:
            return None
        try:
            return sum(int(d.memory_stats()["peak_bytes_in_use"]) for d in self.devices
                       if d.process_index == jax.process_index())
        except (AttributeError, KeyError, TypeError, RuntimeError):
            return None


def placement(params: dict[str, Any]) -> Placement:
    from jax.sharding import Mesh

    ctx = distributed.current()
    gpu = params["device"] == "gpu"
    if gpu:
        try:
            local = jax.local_devices(backend="gpu")
        except RuntimeError:
            local = []
        if not local:
            raise HarnessError(f"device 'gpu' was asked but JAX sees no GPU (jax {jax.__version__}, backend "
                               f"{jax.default_backend()}; a CUDA build is the cuda variant)")
    else:
        local = jax.local_devices(backend="cpu")
    if ctx.distributed:  # one device per worker: the mesh spans the processes
        devices = [d for d in jax.devices() if d.platform == local[0].platform]
        if len(devices) != ctx.world:
            raise HarnessError(f"{ctx.world} workers but JAX sees {len(devices)} devices across the processes")
        return Placement(devices, Mesh(np.array(devices), ("data",)), gpu)
    count = (params["gpus"] or 1) if gpu else 1
    if count > len(local):
        raise HarnessError(f"{count} GPUs were asked but JAX sees {len(local)}")
    devices = local[:count]
    return Placement(devices, Mesh(np.array(devices), ("data",)) if count > 1 else None, gpu)


# --- models ----------------------------------------------------------------------------


def _layers_module() -> Any:
    """The Flax modules of the zoo's layer kinds, made once Flax is imported."""
    if "Unit" in _MODULES:
        return _MODULES["Unit"]
    from jax import lax

    class Conv(nn.Module):
        features: int
        kernel: int
        stride: int
        pad: int
        bias: bool
        layout: str

        @nn.compact
        def __call__(self, x: Any) -> Any:
            nchw = self.layout == "nchw"
            c_in = x.shape[1 if nchw else -1]
            k = self.kernel
            shape = (self.features, c_in, k, k) if nchw else (k, k, c_in, self.features)
            init = nn.initializers.lecun_normal(in_axis=(1, 2, 3) if nchw else (0, 1, 2),
                                                out_axis=0 if nchw else 3)
            w = self.param("kernel", init, shape, jnp.float32).astype(x.dtype)
            dims = ("NCHW", "OIHW", "NCHW") if nchw else ("NHWC", "HWIO", "NHWC")
            y = lax.conv_general_dilated(x, w, (self.stride, self.stride), [(self.pad, self.pad)] * 2,
                                         dimension_numbers=dims)
            if self.bias:
                b = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32).astype(x.dtype)
                y = y + (b.reshape(1, -1, 1, 1) if nchw else b)
            return y

    class Unit(nn.Module):
        """One entry of a layer list (a ResNet block is one unit with its sub-layers)."""

        layer: tuple
        classes: int
        layout: str

        @nn.compact
        def __call__(self, x: Any, train: bool) -> Any:
            return _apply_layer(self.layer, x, train, self.classes, self.layout, Conv, lax)

    _MODULES["Unit"] = Unit
    return Unit


_MODULES: dict[str, Any] = {}


def _apply_layer(layer: tuple, x: Any, train: bool, classes: int, layout: str, conv: Any, lax: Any,
                 name: str | None = None) -> Any:
    """Apply one layer inside a compact Flax module (``name``: the submodule's, in a block)."""
    kind = layer[0]
    nchw = layout == "nchw"
    axis = 1 if nchw else -1
    if kind == "conv":
        _, lname, out, k, stride, pad, bias = layer
        return conv(out, k, stride, pad, bias, layout, name=name)(x)
    if kind == "bn":
        return nn.BatchNorm(use_running_average=not train, axis=axis, momentum=0.9, epsilon=1e-5,
                            dtype=x.dtype, name=name)(x)
    if kind == "relu":
        return jax.nn.relu(x)
    if kind == "maxpool":
        _, _, k, stride, pad = layer
        window = (1, 1, k, k) if nchw else (1, k, k, 1)
        strides = (1, 1, stride, stride) if nchw else (1, stride, stride, 1)
        padding = ((0, 0), (0, 0), (pad, pad), (pad, pad)) if nchw else ((0, 0), (pad, pad), (pad, pad), (0, 0))
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)
    if kind == "gap":
        return x.mean(axis=(2, 3) if nchw else (1, 2))
    if kind == "flatten":
        return x.reshape(x.shape[0], -1)  # memory order, no transpose
    if kind == "dense":
        return nn.Dense(layer[2] or classes, dtype=x.dtype, param_dtype=jnp.float32, name=name)(x)
    if kind == "dropout":
        return nn.Dropout(layer[2], deterministic=not train, name=name)(x)
    if kind == "block":
        _, bname, bkind, width, stride = layer
        in_ch = x.shape[axis]
        main, shortcut = block_layers(bname, bkind, in_ch, width, stride)
        y = x
        for sub in main:
            y = _apply_layer(sub, y, train, classes, layout, conv, lax, name=sub[1] if sub[0] in ("conv", "bn") else None)
        s = x
        for sub in shortcut:
            s = _apply_layer(sub, s, train, classes, layout, conv, lax, name=sub[1])
        return jax.nn.relu(y + s)
    raise HarnessError(f"unknown layer kind {kind!r} in the model zoo")


class Network:
    """The network ``models.MODELS[name]``: one Flax unit per entry of its layer list, applied
    in order; its variables are ``{"params": {unit name: …}, "batch_stats": {unit name: …}}``."""

    def __init__(self, name: str, shape: tuple[int, int, int], classes: int, layout: str) -> None:
        unit = _layers_module()
        self.name, self.shape, self.classes, self.layout = name, shape, classes, layout
        self._units = [(layer[1], unit(layer, classes, layout)) for layer in ZOO[name]]

    def units(self) -> list[tuple[str, Any]]:
        return list(self._units)

    def input_shape(self, batch: int) -> tuple[int, ...]:
        c, h, w = self.shape
        return (batch, c, h, w) if self.layout == "nchw" else (batch, h, w, c)

    def init(self, key: Any) -> dict[str, Any]:
        """The network's variables, made by one program compiled without LLVM's optimisations.

        Run eagerly, each unit's initialisers and forward pass were compiled one operation at
        a time: 54 XLA compilations, about 15-20 s of a 2-CPU host for LeNet-5 (most of a cell's
        time to its first step, paid again by the oneDNN check's run).  One jitted program
        compiles in 8-9 s at XLA's default optimisation, in about 2 s at level 0; it runs once,
        and the random numbers are the same integer arithmetic either way."""
        if isinstance(key, jax.core.Tracer):  # inside a trace (jax.eval_shape, a jitted caller)
            return self._init(key)
        lowered = jax.jit(self._init).lower(key)
        try:
            compiled = lowered.compile(compiler_options={"xla_backend_optimization_level": 0})
        except Exception:  # an XLA build without that option: compile as usual
            compiled = lowered.compile()
        return compiled(key)

    def _init(self, key: Any) -> dict[str, Any]:
        x = jnp.zeros(self.input_shape(2), jnp.float32)
        out: dict[str, dict[str, Any]] = {"params": {}, "batch_stats": {}}
        for name, unit in self._units:
            key, sub = jax.random.split(key)
            variables = unit.init({"params": sub, "dropout": sub}, x, train=False)
            for collection, value in variables.items():
                out.setdefault(collection, {})[name] = value
            x = unit.apply(variables, x, train=False)
        return out

    def apply(self, variables: dict[str, Any], x: Any, *, train: bool, rng: Any = None,
              mutable: bool = False) -> Any:
        """Logits; with ``mutable`` also the new BatchNorm statistics."""
        stats: dict[str, Any] = {}
        for index, (name, unit) in enumerate(self._units):
            sub = {k: v[name] for k, v in variables.items() if name in v}
            rngs = {"dropout": jax.random.fold_in(rng, index)} if rng is not None and train else {}
            if train and "batch_stats" in sub:
                x, updates = unit.apply(sub, x, train=True, rngs=rngs, mutable=["batch_stats"])
                stats[name] = updates["batch_stats"]
            else:
                x = unit.apply(sub, x, train=train, rngs=rngs)
                if "batch_stats" in sub:
                    stats[name] = sub["batch_stats"]
        return (x, stats) if mutable else x


def build(name: str, shape: tuple[int, int, int], classes: int, layout: str) -> Network:
    return Network(name, shape, classes, layout)


def _net(params: dict[str, Any], dataset: Dataset) -> Any:
    """The cell's network: a CNN of the zoo, or a transformer (``_jax_transformers``)."""
    if is_transformer(params["model"]):
        try:
            return transformers.TransformerNetwork(params["model"], dataset.shape, dataset.classes,
                                                   fused=setting(params, "attention") == "fused")
        except ValueError as exc:
            raise HarnessError(str(exc)) from exc
    return build(params["model"], dataset.shape, dataset.classes, params["layout"])


def _tokens(params: dict[str, Any]) -> int:
    """The sequence a transformer cell's attention sees: seq_len (a GPT), patches + 1 (a ViT)."""
    name = params["model"]
    if is_language_model(name):
        return setting(params, "seq_len") or TRANSFORMERS[name].positions
    shape = tuple(params["synthetic_shape"]) if params["dataset"] == "synthetic" else (3, 224, 224)
    from ..datasets import IDX_SHAPES
    shape = IDX_SHAPES.get(params["dataset"], shape)
    try:
        return vit_patches(name, shape) + 1
    except ValueError:
        return 1


def _input(net: Any, x: Any, dtype: Any) -> Any:
    """The step's input in the compute dtype; token ids stay integers."""
    return x if getattr(net, "tokens", False) else x.astype(dtype)


def _per_sample(values: Any) -> Any:
    """A sequence's per-position values averaged to one per sample (a no-op for (batch,))."""
    return values.mean(axis=tuple(range(1, values.ndim))) if values.ndim > 1 else values


def parameter_count(params: Any) -> int:
    return int(sum(math.prod(a.shape) for a in jax.tree_util.tree_leaves(params)))


def compute_dtype(precision: str) -> Any:
    return {"bf16": jnp.bfloat16, "fp16": jnp.float16}.get(precision, jnp.float32)


def _cast(tree: Any, dtype: Any) -> Any:
    if dtype == jnp.float32:
        return tree
    return jax.tree_util.tree_map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _f32(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), tree)


# --- state, optimizer, steps ---------------------------------------------------------------


@dataclass
class State:
    params: Any
    batch_stats: Any
    opt_state: Any
    scale: Any = None  # fp16's loss scale and its count of finite steps

    def variables(self) -> dict[str, Any]:
        return {"params": self.params, "batch_stats": self.batch_stats}


@dataclass
class Sharded:
    """A state replicated over a mesh (global arrays); ``local()`` is this process's copy."""

    state: State

    def local(self) -> State:
        return jax.tree_util.tree_map(lambda a: a.addressable_data(0), self.state,
                                      is_leaf=lambda a: hasattr(a, "addressable_data"))

    def variables(self) -> dict[str, Any]:
        return self.local().variables()


jax_tree_registered = False


def _register_state() -> None:
    global jax_tree_registered
    if not jax_tree_registered:
        jax.tree_util.register_dataclass(State, data_fields=["params", "batch_stats", "opt_state", "scale"],
                                         meta_fields=[])
        jax_tree_registered = True


def make_optimizer(params: dict[str, Any]) -> Any:
    """optax with torch's constants; weight decay is added to the loss (coupled L2)."""
    lr, name = params["lr"], params["optimizer"]
    if name == "sgd":
        return optax.sgd(lr, momentum=params["momentum"] or None)
    if name == "adam":
        return optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8)
    if name == "adadelta":
        return optax.adadelta(lr, rho=0.9, eps=1e-6)
    if name == "rmsprop":
        return optax.rmsprop(lr, decay=0.99, eps=1e-8, eps_in_sqrt=False)
    raise HarnessError(f"optimizer {name!r} is not supported by the jax adapter")


def init_state(net: Network, params: dict[str, Any], shape: tuple[int, int, int], place: Placement) -> State:
    _register_state()
    variables = net.init(jax.random.PRNGKey(params["seed"]))
    scale = ((jnp.asarray(LOSS_SCALE, jnp.float32), jnp.asarray(0, jnp.int32))
             if params["precision"] == "fp16" else None)
    if params.get("mode") == "inference":  # no optimizer: the host leaves it null for inference cells
        opt_state: Any = ()
    else:
        opt_state = jax.jit(make_optimizer(params).init)(variables["params"])  # one compilation, not one per parameter
    state = State(variables["params"], variables.get("batch_stats", {}), opt_state, scale)
    return jax.device_put(state, place.devices[0]) if not place.sharded else state


@dataclass
class Trained:
    """What ``train`` hands to ``layer_ops``: the network, its final state and placement."""

    net: Network
    state: Any
    place: Placement


class Trainer:
    """The training step: one jitted program (one device) or one ``shard_map``-ed program over
    the mesh (several devices / workers), compiled ahead for each batch shape."""

    def __init__(self, net: Network, params: dict[str, Any], state: State, place: Placement, *,
                 input_gradient: bool) -> None:
        self.net, self.place, self.input_gradient = net, place, input_gradient
        self.tx = make_optimizer(params)
        self.weight_decay = params["weight_decay"]
        self.dtype = compute_dtype(params["precision"])
        self.fp16 = params["precision"] == "fp16"
        self.key = jax.random.PRNGKey(params["seed"] + 1)
        self.world = len(place.devices) if place.sharded else 1
        self.step_index = 0
        # the phases one call of the jitted step runs, fused (a mesh's psum is inside it)
        self.phase = "forward+backward+exchange+update" if place.sharded else "forward+backward+update"
        self._compiled: dict[Any, Any] = {}
        self.compile_seconds = 0.0
        self._indices: dict[int, Any] = {}
        if place.sharded:
            from jax.sharding import NamedSharding, PartitionSpec

            self.replicated = NamedSharding(place.mesh, PartitionSpec())
            self.split = NamedSharding(place.mesh, PartitionSpec("data"))
            self.state: Any = Sharded(self._global(state, self.replicated))
        else:
            self.state = state
        self._fn = self._program()

    # one replica's work: gradients of (the loss over its samples / the global count)
    def _grads(self, st: State, x: Any, y: Any, w: Any, total: Any, key: Any) -> tuple[Any, ...]:
        dtype, net, wd = self.dtype, self.net, self.weight_decay
        scale = st.scale[0] if st.scale is not None else 1.0

        def loss_fn(p: Any, xin: Any) -> Any:
            logits, stats = net.apply({"params": _cast(p, dtype), "batch_stats": st.batch_stats},
                                      _input(net, xin, dtype), train=True, rng=key, mutable=True)
            logits = logits.astype(jnp.float32)
            losses = _per_sample(optax.softmax_cross_entropy_with_integer_labels(logits, y)) * w
            loss_sum = losses.sum()
            loss = loss_sum / total
            if wd:
                l2 = sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(p))
                loss = loss + 0.5 * wd * l2 / self.world
            correct = jnp.sum(_per_sample((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)) * (w > 0))
            return loss * scale, (loss_sum, correct, _f32(stats))

        if self.input_gradient:
            (_, (loss_sum, correct, stats)), (g, gx) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
                st.params, x)
            computed = jnp.any(gx != 0).astype(jnp.int32)  # consumes the input's gradient: XLA keeps it
        else:
            (_, (loss_sum, correct, stats)), g = jax.value_and_grad(loss_fn, has_aux=True)(st.params, x)
            computed = jnp.zeros((), jnp.int32)
        return g, loss_sum, correct, stats, computed

    def _update(self, st: State, g: Any, stats: Any) -> State:
        if st.scale is None:
            updates, opt_state = self.tx.update(g, st.opt_state, st.params)
            return State(optax.apply_updates(st.params, updates), stats, opt_state, None)
        scale, good = st.scale
        g = jax.tree_util.tree_map(lambda a: a / scale, g)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(a)) for a in jax.tree_util.tree_leaves(g)]))
        updates, opt_state = self.tx.update(g, st.opt_state, st.params)
        params = optax.apply_updates(st.params, updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        grown = jnp.where(good + 1 >= LOSS_SCALE_PERIOD, scale * 2.0, scale)
        new_scale = jnp.where(finite, grown, scale / 2.0)
        new_good = jnp.where(finite, jnp.where(good + 1 >= LOSS_SCALE_PERIOD, 0, good + 1), 0)
        return State(keep(params, st.params), keep(stats, st.batch_stats), keep(opt_state, st.opt_state),
                     (new_scale, new_good))

    def _program(self) -> Any:
        if not self.place.sharded:
            def step(st: State, x: Any, y: Any, w: Any, index: Any) -> tuple[Any, ...]:
                key = jax.random.fold_in(self.key, index)
                total = jnp.sum(w)
                g, loss_sum, correct, stats, computed = self._grads(st, x, y, w, total, key)
                return self._update(st, g, stats), loss_sum, correct, computed

            return jax.jit(step, donate_argnums=(0,))

        from jax import shard_map
        from jax.sharding import PartitionSpec as P

        def shard_step(st: State, x: Any, y: Any, w: Any, index: Any) -> tuple[Any, ...]:
            key = jax.random.fold_in(jax.random.fold_in(self.key, index), jax.lax.axis_index("data"))
            total = jax.lax.psum(jnp.sum(w), "data")
            g, loss_sum, correct, stats, computed = self._grads(st, x, y, w, total, key)
            g = jax.lax.psum(g, "data")  # the all-reduce
            stats = jax.lax.pmean(stats, "data")
            return (self._update(st, g, stats), loss_sum.reshape(1), correct.reshape(1), computed.reshape(1))

        mapped = shard_map(shard_step, mesh=self.place.mesh,
                           in_specs=(P(), P("data"), P("data"), P("data"), P()),
                           out_specs=(P(), P("data"), P("data"), P("data")), check_vma=False)
        return jax.jit(mapped, donate_argnums=(0,))

    def _global(self, tree: Any, sharding: Any) -> Any:
        """Host values (the same on every process) as global arrays replicated over the mesh."""
        def one(a: Any) -> Any:
            value = np.asarray(a)
            return jax.make_array_from_process_local_data(sharding, value, value.shape)
        return jax.tree_util.tree_map(one, tree)

    def batch(self, xb: Any, yb: Any, size: int) -> tuple[Any, Any, Any]:
        """This process's share of a global batch of ``size`` as the step's inputs (on the
        device, ready): ``put(host_batch(...))``."""
        return self.put(self.host_batch(xb, yb, size), size)

    def host_batch(self, xb: Any, yb: Any, size: int) -> tuple[Any, Any, Any]:
        """The step's inputs on the host (numpy): the samples, labels and weights; on a mesh
        this process's samples split over its devices, each part padded to the largest share."""
        if not self.place.sharded:
            return xb, yb, np.ones(len(yb), np.float32)
        # equal shares: pad this process's samples (one device each) to the largest share
        local = len(self.place.mesh.local_devices)
        per = math.ceil(size / self.world)
        xs, ys, ws = [], [], []
        for d in range(local):  # (one device per process except gpus > 1 in one process)
            part_x, part_y = xb[d::local], yb[d::local]
            pad = per - len(part_y)
            w = np.concatenate([np.ones(len(part_y), np.float32), np.zeros(pad, np.float32)])
            if pad:
                take = np.arange(pad) % max(len(part_y), 1)
                part_x = np.concatenate([part_x, part_x[take]]) if len(part_y) else np.zeros((pad, *xb.shape[1:]),
                                                                                            xb.dtype)
                part_y = np.concatenate([part_y, part_y[take]]) if len(part_y) else np.zeros(pad, yb.dtype)
            xs.append(part_x), ys.append(part_y), ws.append(w)
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)

    def put(self, host: tuple[Any, Any, Any], size: int) -> tuple[Any, Any, Any]:
        """``host_batch``'s arrays on the device (one, or this process's part of the mesh),
        waited for with ``block_until_ready``."""
        xh, yh, wh = host
        if not self.place.sharded:
            return jax.block_until_ready(jax.device_put((xh, yh, wh), self.place.devices[0]))
        glob = math.ceil(size / self.world) * self.world
        x = jax.make_array_from_process_local_data(self.split, xh, (glob, *xh.shape[1:]))
        y = jax.make_array_from_process_local_data(self.split, yh, (glob,))
        w = jax.make_array_from_process_local_data(self.split, wh, (glob,))
        return jax.block_until_ready((x, y, w))

    def prepare(self, sizes: list[int]) -> None:
        """Compile the step for every batch size (the global size on a mesh) ahead of time;
        the seconds it took add up in ``compile_seconds``."""
        for size in sorted(set(sizes)):
            if self._key(size) in self._compiled:
                continue
            t0 = time.perf_counter()
            xb = np.zeros((self._local_count(size), *self.net.input_shape(1)[1:]),
                          getattr(self.net, "input_dtype", np.float32))
            yb = np.zeros((len(xb), *getattr(self.net, "target_tail", ())), np.int32)
            x, y, w = self.batch(xb, yb, size)
            self._compiled[self._key(size)] = self._fn.lower(self._state_arg(), x, y, w, self._index(0)).compile()
            self.compile_seconds += time.perf_counter() - t0

    def compilation(self) -> dict[str, Any]:
        """The summary's ``compilation``: the training step's XLA compilations (before the
        first step of each batch shape, outside every step's clock)."""
        return {"mode": "compiled", "implementation": f"jax.jit (XLA, jax {jax.__version__})",
                "seconds": round(self.compile_seconds, 6), "batch_sizes": sorted(self._compiled, reverse=True),
                "backward": True}

    def _index(self, value: int) -> Any:
        """The step counter (the dropout key's input) as the step's last argument."""
        if self.place.sharded:
            return jax.make_array_from_process_local_data(self.replicated, np.asarray(value, np.int32), ())
        return jax.device_put(np.asarray(value, np.int32), self.place.devices[0])

    def _local_count(self, size: int) -> int:
        ctx = distributed.current()
        if ctx.distributed:
            return distributed.local_count(size, ctx.rank, ctx.world)
        return size

    def _key(self, size: int) -> int:
        return math.ceil(size / self.world) if self.place.sharded else size

    def _state_arg(self) -> Any:
        return self.state.state if isinstance(self.state, Sharded) else self.state

    def indices(self, count: int) -> None:
        """Put the next ``count`` step counters on the device ahead of their steps (outside
        the clock: a ``device_put`` per step is a host round trip inside it)."""
        self._indices = {i: self._index(i) for i in range(self.step_index, self.step_index + count)}

    def run(self, size: int, x: Any, y: Any, w: Any) -> tuple[Any, Any, Any]:
        """One step (inputs from ``batch``); returns (loss sum, correct, input-gradient flag)
        of this process, once the device has finished.

        The wait is for the three small outputs: every output of one XLA execution is ready
        when that execution ends (one program, one completion event per device), so waiting
        on the new state's ~500 arrays as well only adds host time to every timed step (with the
        counter put inside the clock, 1.7 ms of a 28 ms bf16 ResNet-50 step on an H100:
        benchmarks/jax_step_gap.py)."""
        compiled = self._compiled[self._key(size)]
        index = self._indices.pop(self.step_index, None)
        if index is None:
            index = self._index(self.step_index)
        new, loss_sum, correct, computed = compiled(self._state_arg(), x, y, w, index)
        jax.block_until_ready((loss_sum, correct, computed))
        self.state = Sharded(new) if self.place.sharded else new
        self.step_index += 1
        return loss_sum, correct, computed

    def local_state(self) -> State:
        return self.state.local() if isinstance(self.state, Sharded) else self.state


def _local_value(a: Any) -> Any:
    """This process's value of a step output (a sum over its shards on a mesh)."""
    if hasattr(a, "addressable_shards") and len(a.addressable_shards) and a.ndim:
        return sum(np.asarray(s.data).sum() for s in a.addressable_shards)
    return np.asarray(a)


def train_epoch(trainer: Trainer, feed: Feed, starts: list[tuple[int, int]], *, epoch: int, seed: int,
                record: Callable[[StepSample], None], ctx: distributed.Context,
                gradients: list[int] | None = None,
                clock_for: Callable[[], StepClock | None] = lambda: None) -> tuple[int, float, float, float]:
    """One pass (or a budget of steps) over the shuffled data: (steps, loss, accuracy, seconds).

    Preloaded data: the batch is sliced and put on the device before the clock starts; only
    the step and the wait for it sit between the two readings.  A loader: fetching the batch
    (and putting it on the device) comes first, inside the clock.  Loss sums and correct
    counts stay device values until the epoch ends.  ``clock_for``: the next step's phase
    clock (``log.phase_clock``), None for a step that is not sampled; it is marked after the
    loader's fetch (``input``, the host-side padding of a mesh included), after the
    ``device_put`` (``h2d``) and after the jitted step (``trainer.phase``: one fused XLA
    program), each mark after the ``block_until_ready`` that every step makes."""
    t_epoch = time.perf_counter()
    trainer.prepare([size for _, size in starts])
    trainer.indices(len(starts))
    order = np.random.default_rng([seed, epoch]).permutation(len(feed.y))
    batches = feed.epoch(starts, order, rank=ctx.rank, world=ctx.world)
    sums, counts, computed = [], [], []
    seen = 0
    fused = trainer.phase
    for start, size in starts:
        if feed.loader:
            clock = clock_for()
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            xb, yb = next(batches)
            host = trainer.host_batch(xb, yb, size)  # numpy: done when it returns
            if clock is not None:
                clock.mark("input")
            x, y, w = trainer.put(host, size)  # waits for the copy (block_until_ready)
            if clock is not None:
                clock.mark("h2d")
        else:
            xb, yb = next(batches)
            x, y, w = trainer.batch(xb, yb, size)
            clock = clock_for()
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
        loss_sum, correct, flag = trainer.run(size, x, y, w)  # waits for the outputs (block_until_ready)
        if clock is not None:
            clock.mark(fused)
        t1 = time.perf_counter()
        record((epoch, t0, t1, ctx.recorded_images(size)))
        if clock is not None:
            clock.end()
        sums.append(loss_sum)
        counts.append(correct)
        computed.append(flag)
        seen += distributed.local_count(size, ctx.rank, ctx.world)
    loss_value = float(sum(_local_value(s) for s in sums)) if sums else math.nan
    correct_value = float(sum(_local_value(c) for c in counts)) if counts else 0.0
    if gradients is not None:
        gradients[0] += int(sum(1 for c in computed if int(np.min(_flags(c))) == 1))
    seconds = time.perf_counter() - t_epoch
    return len(sums), loss_value / max(seen, 1), correct_value / max(seen, 1), seconds


def _flags(a: Any) -> Any:
    if hasattr(a, "addressable_shards") and a.ndim:
        return np.concatenate([np.asarray(s.data).reshape(-1) for s in a.addressable_shards])
    return np.asarray(a).reshape(-1)


class Evaluator:
    """Mean cross-entropy and accuracy over a split, on this process's first device."""

    def __init__(self, net: Network, params: dict[str, Any]) -> None:
        dtype = compute_dtype(params["precision"])

        def step(variables: Any, x: Any, y: Any) -> tuple[Any, Any]:
            logits = net.apply(_cast(variables, dtype), _input(net, x, dtype), train=False).astype(jnp.float32)
            loss = _per_sample(optax.softmax_cross_entropy_with_integer_labels(logits, y)).sum()
            return loss, jnp.sum(_per_sample((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)))

        self.step = jax.jit(step)

    def run(self, state: State, x: Any, y: Any, batch_size: int) -> tuple[float, float, float]:
        n = len(y)
        t0 = time.perf_counter()
        variables = state.variables()
        sums, counts = [], []
        for start in range(0, n, batch_size):
            loss, correct = self.step(variables, x[start:start + batch_size], y[start:start + batch_size])
            sums.append(loss)
            counts.append(correct)
        jax.block_until_ready((sums, counts))
        loss_value, correct_value = float(sum(np.asarray(s) for s in sums)), float(sum(np.asarray(c) for c in counts))
        return loss_value / n, correct_value / n, time.perf_counter() - t0


# --- multi-worker: the exchange ----------------------------------------------------------------


def weights_checksum(state: State) -> float:
    """Sum of |w| over the trainable weights: equal on every worker of a synchronous cell."""
    return float(sum(float(np.abs(np.asarray(a, np.float64)).sum()) for a in jax.tree_util.tree_leaves(state.params)))


def _psum_program(trainer: Trainer, elements: int) -> tuple[Any, Any]:
    """The step's collective alone: a compiled program that all-reduces (``psum`` over the
    mesh's ``data`` axis) a float32 buffer of ``elements`` per device, and that buffer (ones)."""
    from jax import shard_map
    from jax.sharding import PartitionSpec as P

    mesh = trainer.place.mesh
    local = len(mesh.local_devices)
    buffer = jax.make_array_from_process_local_data(trainer.split, np.ones(elements * local, np.float32),
                                                    (elements * trainer.world,))
    program = jax.jit(shard_map(lambda v: jax.lax.psum(v, "data"), mesh=mesh, in_specs=P("data"),
                                out_specs=P("data"), check_vma=False))
    return program.lower(buffer).compile(), buffer


def _calibrate(trainer: Trainer, ctx: distributed.Context) -> dict[str, Any]:
    """Before training (every worker, the same calls): the all-reduce of the step's exchange
    (``psum`` over the mesh, a program compiled ahead for each size) of a float32 buffer of
    each of ``phases.CALIBRATION_BYTES`` per worker, each timed call after an untimed
    one-number ``psum`` (a barrier), waited for with ``block_until_ready`` (docs/MODEL.md).
    XLA's gloo collectives run gloo's ring all-reduce (``gloo_communicator.cc`` sets
    ``Algorithm::RING``); NCCL picks its own algorithm.  The step's gradients are all-reduced
    as one combined all-reduce after the whole backward pass (the compiled CPU program holds a
    single tuple ``all-reduce`` of every gradient): it does not overlap backward."""
    barrier, ones = _psum_program(trainer, 1)

    def prepare(size: int) -> Callable[[], Any]:
        program, buffer = _psum_program(trainer, size // 4)
        return lambda: jax.block_until_ready(program(buffer))

    points = time_collective(prepare, barrier=lambda: jax.block_until_ready(barrier(ones)))
    gpu = trainer.place.gpu
    return calibration(points, pattern="all-reduce" if gpu else "ring all-reduce",
                       transport="nccl" if gpu else "gloo", workers=ctx.world, overlaps_backward=False)


def _exchange(trainer: Trainer, feed: Feed, batch: int, log: EventLog, ctx: distributed.Context,
              calibrated: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """After training (every worker, the same calls): the gradients of this worker's share of the
    first global batch computed alone (a program on its own device) and inside the mesh program
    followed by the all-reduce (``psum``), ``EXCHANGE_PROBE_ROUNDS`` each, alternating, each after
    an untimed one-number all-reduce (a barrier); no update.  The difference of the medians is
    the time the exchange adds to a step (the mesh program's own overhead included).
    ``calibrated``: ``_calibrate``'s result, the ``calibration`` entry."""
    if not ctx.distributed:
        return None
    from jax import shard_map
    from jax.sharding import PartitionSpec as P

    local = trainer.local_state()
    checksum = weights_checksum(local)
    size = min(batch, len(feed.y))
    xb, yb = feed.probe_batch(size, ctx.rank, ctx.world)
    x, y, w = trainer.batch(xb, yb, size)
    st = trainer._state_arg()
    key = jnp.asarray(0, jnp.int32)

    def reduced(st: State, x: Any, y: Any, w: Any) -> Any:
        total = jax.lax.psum(jnp.sum(w), "data")
        g = jax.lax.psum(trainer._grads(st, x, y, w, total, trainer.key)[0], "data")
        return sum(jnp.sum(a) for a in jax.tree_util.tree_leaves(g)).reshape(1)

    mesh = trainer.place.mesh
    with_exchange = jax.jit(shard_map(reduced, mesh=mesh, in_specs=(P(), P("data"), P("data"), P("data")),
                                      out_specs=P("data"), check_vma=False)).lower(st, x, y, w).compile()
    barrier, ones = _psum_program(trainer, 1)
    device = trainer.place.mesh.local_devices[0]
    own = jax.device_put((local, np.asarray(x.addressable_shards[0].data), np.asarray(y.addressable_shards[0].data),
                          np.asarray(w.addressable_shards[0].data)), device)
    total = float(batch if size == batch else size)

    def alone_fn(st: State, x: Any, y: Any, w: Any) -> Any:
        g = trainer._grads(st, x, y, w, total, trainer.key)[0]
        return sum(jnp.sum(a) for a in jax.tree_util.tree_leaves(g))

    alone = jax.jit(alone_fn).lower(*own).compile()
    del key
    timed: dict[bool, list[float]] = {True: [], False: []}
    for i in range(EXCHANGE_PROBE_ROUNDS * 2):
        exchanged = (i % 2 == 0) == (i // 2 % 2 == 0)
        jax.block_until_ready(barrier(ones))  # start together (untimed)
        t0 = time.perf_counter()
        jax.block_until_ready(with_exchange(st, x, y, w) if exchanged else alone(*own))
        timed[exchanged].append(time.perf_counter() - t0)
    synced, alone_median = statistics.median(timed[True]), statistics.median(timed[False])
    steps = [t1 - t0 for _, t0, t1, _ in log.rated()]  # the sampled steps' waits left out
    step_median = statistics.median(steps) if steps else None
    added = synced - alone_median
    return {"method": "probe after training: gradients of the worker's share computed alone and inside the mesh "
                      "program followed by an all-reduce (psum, gloo on the CPU), difference of medians",
            "backend": "gloo" if not trainer.place.gpu else "nccl",
            "seconds_median": added, "fraction_of_step": added / step_median if step_median else None,
            "sync_pass_seconds_median": synced, "no_sync_pass_seconds_median": alone_median,
            "added_seconds": added, "rounds": EXCHANGE_PROBE_ROUNDS, "weights_checksum": checksum,
            "calibration": calibrated}


# --- data ------------------------------------------------------------------------------


def arrays(split: Split, shape: tuple[int, int, int], layout: str) -> tuple[Any, Any]:
    """float32 images normalised to [-1, 1] (NCHW or NHWC) and int32 labels, as numpy arrays;
    token data: int32 inputs and targets, (count, seq_len) each."""
    if isinstance(split, TokenSplit):
        return split.arrays(np)
    x = np.frombuffer(bytes(split.images), np.uint8).reshape(split.count, *shape).astype(np.float32)
    x = (x / 255.0 - 0.5) / 0.5
    if layout == "nhwc":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = np.asarray(split.labels, dtype=np.int64).astype(np.int32)
    return x, y


@dataclass
class Feed:
    """What feeds the training steps (``input_pipeline``).

    ``preloaded``: the normalised training set is held in host memory; each epoch permutes it
    (untimed) and each step's batch is put on the device, and waited for, before the clock
    starts.
    ``loader``: the stored uint8 images stay on the host and a loader converts each sample
    (float, /255, mean 0.5 / std 0.5, NHWC when asked) as the batch is fetched, inside the
    step's clock: ``loader_workers`` N > 0 threads of a ``ThreadPoolExecutor`` (numpy releases
    the GIL in the conversions) with 2·N batches submitted ahead, or 0: in the training thread.
    JAX has no loader of its own; the batches and their order equal the preloaded path's."""

    params: dict[str, Any]
    split: Split
    shape: tuple[int, int, int]
    place: Placement
    loader: bool = False
    workers: int = 0
    batches: int = 0
    seen: dict[int, int] = field(default_factory=dict)  # thread id -> batches it converted (0: this thread)

    def __post_init__(self) -> None:
        self.layout = self.params["layout"]
        self.loader = setting(self.params, "input_pipeline") == "loader"
        self.workers = setting(self.params, "loader_workers") if self.loader else 0
        if self.loader:
            self.x = np.frombuffer(bytes(self.split.images), np.uint8).reshape(self.split.count, *self.shape)
            self.y = np.asarray(self.split.labels, dtype=np.int64).astype(np.int32)
            self._main = threading.get_ident()
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="matrun-loader") if self.workers else None
        else:
            self.x, self.y = arrays(self.split, self.shape, self.layout)

    def _convert(self, indices: Any) -> tuple[Any, Any]:
        x = (self.x[indices].astype(np.float32) / 255.0 - 0.5) / 0.5
        if self.layout == "nhwc":
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        ident = threading.get_ident()
        key = 0 if ident == self._main else ident
        self.seen[key] = self.seen.get(key, 0) + 1
        return x, self.y[indices]

    def epoch(self, starts: list[tuple[int, int]], order: Any, *, rank: int = 0, world: int = 1) -> Any:
        """The epoch's batches (this worker's ``[rank::world]`` share of each global batch),
        as an iterator of numpy arrays whose ``next`` fetches one."""
        picks = [order[start + rank:start + size:world] for start, size in starts]
        if not self.loader:
            xs, ys = self.x[order], self.y[order]
            for start, size in starts:
                self.batches += 1
                yield xs[start + rank:start + size:world], ys[start + rank:start + size:world]
            return
        if self._pool is None:
            for indices in picks:
                self.batches += 1
                yield self._convert(indices)
            return
        for batch in prefetched(self._pool, self._convert, picks, 2 * self.workers):
            self.batches += 1
            yield batch

    def probe_batch(self, size: int, rank: int, world: int) -> tuple[Any, Any]:
        """This worker's share of the first ``size`` samples, normalised (the exchange probe)."""
        if not self.loader:
            return self.x[rank:size:world], self.y[rank:size:world]
        return self._convert(np.arange(rank, size, world))

    def describe(self) -> dict[str, Any]:
        """The summary's ``input_pipeline``: what really fed the steps."""
        if not self.loader:
            return {"kind": "preloaded"}
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return {"kind": "loader", "implementation": "concurrent.futures.ThreadPoolExecutor (numpy conversion per "
                "batch), 2 batches per thread submitted ahead" if self.workers else "in the training thread",
                "workers": self.workers, "workers_seen": len([t for t in self.seen if t != 0]),
                "batches": self.batches, "batches_in_process": self.seen.get(0, 0)}
