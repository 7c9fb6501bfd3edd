"""PyTorch adapter (framework ``torch``): the model zoo on in-memory tensors, timed per step.

Networks are built from ``models.MODELS`` (one ``nn.Module`` per entry of the layer list,
named after it), so their parameter counts equal ``models.param_count`` by construction.
Data: pixels / 255, then normalised with mean 0.5 and std 0.5 (values in [-1, 1]) for
every dataset, so that the same cell means the same input across datasets and frameworks.
Each epoch reshuffles the whole training set with a seeded ``torch.Generator`` and slices
batches out of it; the last partial batch is kept.  With ``input_pipeline = "loader"`` a
``torch.utils.data.DataLoader`` (``loader_workers`` worker processes) fetches the same batches
from the stored bytes, converting each sample as it goes, inside the step's clock (``_Feed``).
``first_layer_backward = "full"``: each batch requires a gradient, so backward also computes
the first layer's input gradient (autograd skips it otherwise).

Multi-worker cells (``workers`` × ``nodes`` > 1, started by the launcher): one process per
worker, ``DistributedDataParallel`` over a process group (gloo on the CPU, NCCL on GPUs,
one GPU per worker), its TCP store on a socket rank 0 binds to ``MASTER_ADDR`` (127.0.0.1)
itself, never to every interface; each worker trains on every ``world``-th sample of the
same global batches; the allreduce is the comm hook ``_ExchangeTimer`` (a SUM of gradients
of a loss divided by the global batch, so the result is the global batch's mean gradient),
which also times it (docs/HARNESS.md "Multi-worker cells").

Switches: ``device = "gpu"`` is ``cuda:0`` (``gpus`` > 1: ``nn.DataParallel`` over
``cuda:0..gpus-1``); ``layout = "nhwc"`` is ``channels_last`` for the model and the inputs;
``precision`` bf16 / fp16 is ``torch.autocast`` around the forward pass (fp16 with a
``GradScaler``), tf32 sets ``allow_tf32`` for matmul and cuDNN (fp32 clears both: PyTorch
allows TF32 in cuDNN convolutions by default); ``conv_algo = "autotune"`` is
``cudnn.benchmark``.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import os
import socket
import statistics
import time
from collections import OrderedDict
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from ..errors import HarnessError
from .. import distributed
from ..datasets import Dataset, Split
from ..events import EventLog, StepSample
from ..layers import LayerOp, LayerOps
from ..phases import StepClock, calibration, time_collective
from ..models import MODELS, TRANSFORMERS, Layer, block_layers, is_transformer, model_flops, walk
from ..spec import setting
from ..text import TokenSplit
from . import TrainOutcome
from . import _torch_transformers as transformers

NAME = "torch"


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    if params["device"] == "cpu" and params["precision"] in ("fp16", "tf32"):
        return (f"[params -> precision] {params['precision']} needs device = \"gpu\" on torch "
                "(autocast on the CPU is bf16; TF32 is a GPU feature)")
    if params["device"] == "cpu" and params["conv_algo"] == "autotune":
        return "[params -> conv_algo] autotune needs device = \"gpu\" (it selects cuDNN algorithms)"
    if setting(params, "compile") == "compiled":
        if not hasattr(torch, "compile"):
            return f"[params -> compile] compiled needs torch.compile (PyTorch 2.0+); this is torch {torch.__version__}"
        if params["layer_profile"]:
            return "[params -> compile] layer_profile times the eager layers one by one: leave compile out"
        if distributed.multi_process(params) or (params["device"] == "gpu" and (params["gpus"] or 1) > 1):
            return ("[params -> compile] compiled runs one process on one device here (torch.compile of a "
                    "DDP / DataParallel model is not measured by matrun yet): use workers = 1, gpus = 1")
    if setting(params, "attention") == "fused" and not hasattr(nn.functional, "scaled_dot_product_attention"):
        return (f"[params -> attention] fused needs torch.nn.functional.scaled_dot_product_attention (PyTorch "
                f"2.0+); this is torch {torch.__version__}")
    return None


def configure(params: dict[str, Any]) -> None:
    """Apply threads, oneDNN, GPU math switches and the seed; inter-op threads first."""
    if params["interop_threads"] != "unset":
        try:
            torch.set_num_interop_threads(params["interop_threads"])
        except RuntimeError:
            pass  # already started: probe reports the count in force as a mismatch
    if params["threads"] != "unset":
        torch.set_num_threads(params["threads"])
    torch.backends.mkldnn.enabled = params["onednn"]
    if params["device"] == "gpu":
        tf32 = params["precision"] == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = params["conv_algo"] == "autotune"
    torch.manual_seed(params["seed"])


def probe(params: dict[str, Any]) -> dict[str, Any]:
    asked = _asked_device(params)
    used = _usable_device(asked)
    in_force: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "onednn": bool(torch.backends.mkldnn.enabled),
        "onednn_available": bool(torch.backends.mkldnn.is_available()),
        "mkl_available": bool(torch.backends.mkl.is_available()),
        "cuda_available": bool(torch.cuda.is_available()),
        "device": used,
        "layout": _weight_layout(params["layout"]) if params["layout"] is not None else None,
        "precision": params["precision"],
        # eager unless the cell asks for torch.compile: PyTorch's own default
        "compile": "compiled" if setting(params, "compile") == "compiled" else "eager",
    }
    if is_transformer(params["model"]):
        seq = setting(params, "seq_len") or TRANSFORMERS[params["model"]].positions
        in_force.update(transformers.in_force(params, torch.device(used), params["model"], seq))
    mismatches = []
    if torch.cuda.is_available():
        in_force.update(
            cuda_version=torch.version.cuda, cudnn_version=torch.backends.cudnn.version(),
            gpu_count=torch.cuda.device_count(),
            gpu_names=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            allow_tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
            allow_tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark))
        if params["device"] == "gpu":
            in_force["conv_algo"] = "autotune" if torch.backends.cudnn.benchmark else "heuristic"
            if in_force["conv_algo"] != params["conv_algo"]:
                mismatches.append(f"conv_algo: asked {params['conv_algo']}, in force {in_force['conv_algo']} "
                                  f"(cudnn.benchmark {_js(bool(torch.backends.cudnn.benchmark))})")
        if params["device"] == "gpu" and (params["gpus"] or 1) > torch.cuda.device_count():
            mismatches.append(f"gpus: asked {params['gpus']}, in force {torch.cuda.device_count()}")
    for key in ("threads", "interop_threads"):
        if params[key] != "unset" and params[key] != in_force[key]:
            mismatches.append(f"{key}: asked {params[key]}, in force {in_force[key]}")
    if params["onednn"] != in_force["onednn"]:
        mismatches.append(f"onednn: asked {_js(params['onednn'])}, in force {_js(in_force['onednn'])}")
    elif params["onednn"] and not in_force["onednn_available"]:
        mismatches.append("onednn: asked true, but this torch build has no oneDNN")
    if asked != used:
        mismatches.append(f"device: asked {params['device']}, in force {used}")
    if params["layout"] is not None and in_force["layout"] != params["layout"]:
        mismatches.append(f"layout: asked {params['layout']}, in force {in_force['layout']}")
    ctx = distributed.current()
    if ctx.distributed:
        in_force.update(rank=ctx.rank, world_size=ctx.world,
                        backend="nccl" if params["device"] == "gpu" else "gloo")
    return {
        "framework_version": torch.__version__,
        "build": torch.__config__.show(),
        "in_force": in_force,
        "mismatches": mismatches,
    }


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    if distributed.current().distributed:
        return _train_workers(params, dataset, log, distributed.current())
    device = _device(params)
    _reset_peak_memory(device, params)
    feed = _Feed(params, dataset.train, dataset.shape, device)
    x_train, y_train = feed.x, feed.y
    x_test, y_test = _tensors(dataset.test, dataset.shape, device, params["layout"])
    held = _tensors(dataset.validation, dataset.shape, device, params["layout"]) if dataset.validation else None
    model = _placed(_net(params, dataset), params, device)
    _emit_model(log, params, dataset, model)
    optimizer, loss_fn, generator, amp, scaler = _training_kit(params, model, device)
    model, compiled = _compiled(params, model, loss_fn, amp, x_train, y_train, params["batch_size"])
    iterations, patience = params["iterations"], setting(params, "early_stopping")
    full = setting(params, "first_layer_backward") == "full"
    gradients = [0]  # steps whose backward produced the input's gradient

    def outcome(**more: Any) -> TrainOutcome:
        return TrainOutcome(model=model, peak_device_memory_bytes=_peak_memory(device, params),
                            input_gradient_steps=gradients[0], input_pipeline=feed.describe(),
                            compilation=compiled, compile_times=_COMPILE_TIMES if compiled else None, **more)

    epoch, done = 0, 0
    while (done < iterations) if iterations else (epoch < params["epochs"]):
        budget = iterations - done if iterations else None
        steps, loss, accuracy, seconds = _train_epoch(
            model, optimizer, loss_fn, x_train, y_train, epoch=epoch, batch_size=params["batch_size"],
            budget=budget, generator=generator, record=log.steps.append, amp=amp, scaler=scaler,
            channels_last=params["layout"] == "nhwc", feed=feed, input_grad=full, gradients=gradients,
            clock_for=lambda: log.phase_clock(_device_wait(device)))
        done += steps
        test_loss, test_accuracy, test_seconds = evaluate(model, x_test, y_test, params["eval_batch_size"], amp=amp)
        validation = evaluate(model, *held, params["eval_batch_size"], amp=amp) if held else None
        diverged = not math.isfinite(loss)
        log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                  test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                  validation=validation)
        if diverged:
            return outcome(diverged=True, notes=[f"training loss became {loss} in epoch {epoch}; stopped"])
        if log.should_stop(patience):
            return outcome(stopped_early=True)
        epoch += 1
    return outcome()


def infer(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    """Forward passes over the test split in batches (cycling): ``iterations`` or one pass."""
    device = _device(params)
    _reset_peak_memory(device, params)
    x, _ = _tensors(dataset.test, dataset.shape, device, params["layout"])
    model = _placed(_net(params, dataset), params, device)
    _emit_model(log, params, dataset, model)
    model.eval()
    model, compiled = _compiled(params, model, None, _autocast(params, device), x, None, params["batch_size"])
    amp = _autocast(params, device)
    batch_size, count = params["batch_size"], len(x)
    per_pass = math.ceil(count / batch_size)
    batches = params["iterations"] or per_pass
    sync = device.type == "cuda"
    record = log.steps.append
    t_all = time.perf_counter()
    with torch.inference_mode():
        for index in range(batches):
            start = (index % per_pass) * batch_size
            xb = x[start:start + batch_size]
            t0 = time.perf_counter()
            if amp is None:
                model(xb)
            else:
                with amp:
                    model(xb)
            if sync:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            record((index // per_pass, t0, t1, len(xb)))
    seconds = time.perf_counter() - t_all
    return TrainOutcome(model=model, inference_seconds=seconds, peak_device_memory_bytes=_peak_memory(device, params),
                        compilation=compiled, compile_times=_COMPILE_TIMES if compiled else None)


def layer_ops(params: dict[str, Any], dataset: Dataset, model: nn.Module) -> LayerOps:
    """Per-layer forward / backward callables on real activations of one batch (docs/HARNESS.md)."""
    net = model.module if isinstance(model, nn.DataParallel) else model
    device = next(net.parameters()).device
    training = params["mode"] == "train"
    if is_transformer(params["model"]):
        return _transformer_layer_ops(params, dataset, net, device, training)
    split = dataset.train if training else dataset.test
    x, y = _tensors(split, dataset.shape, device, params["layout"], limit=params["batch_size"])
    amp = _autocast(params, device)
    ctx: Callable[[], ContextManager[Any]] = (lambda: amp) if amp is not None else contextlib.nullcontext
    layers = list(net.children())
    net.train(training)

    # One connected pass: the real gradient of the loss w.r.t. every layer's output.
    outputs, h = [], x
    with torch.set_grad_enabled(training), ctx():
        for layer in layers:
            h = layer(h)
            outputs.append(h)
    upstream: list[torch.Tensor | None] = [None] * len(layers)
    if training:
        loss = nn.functional.cross_entropy(outputs[-1].float(), y)
        upstream = list(torch.autograd.grad(loss, outputs))

    ops = []
    skip_first = setting(params, "first_layer_backward") == "skip"
    for i, layer in enumerate(layers):
        inp = (x if i == 0 else outputs[i - 1]).detach()
        ops.append(_layer_op(layer, inp, upstream[i], first=i == 0 and skip_first, training=training, ctx=ctx))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return LayerOps(ops=ops, images=len(x), sync=sync)


def _transformer_layer_ops(params: dict[str, Any], dataset: Dataset, net: nn.Module, device: torch.device,
                           training: bool) -> LayerOps:
    """A transformer's units (``_torch_transformers.units``) on real activations of one batch:
    each unit's forward alone on its real input, its backward alone given the real gradient of
    the loss with respect to its output (the residual additions between them are not timed)."""
    split = dataset.train if training else dataset.test
    x, y = _tensors(split, dataset.shape, device, params["layout"], limit=params["batch_size"])
    amp = _autocast(params, device)
    ctx: Callable[[], ContextManager[Any]] = (lambda: amp) if amp is not None else contextlib.nullcontext
    listed = transformers.units(net)
    net.train(training)
    with torch.set_grad_enabled(training), ctx():
        inputs, outputs = transformers.unit_inputs(listed, x)
    upstream: list[torch.Tensor | None] = [None] * len(listed)
    if training:
        logits = outputs[-1].float()
        loss = nn.functional.cross_entropy(logits.transpose(1, 2) if logits.dim() == 3 else logits, y)
        upstream = list(torch.autograd.grad(loss, outputs))
    ops = [_layer_op(unit, inputs[i].detach(), upstream[i], first=i == 0, training=training, ctx=ctx)
           for i, (unit, _) in enumerate(listed)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return LayerOps(ops=ops, images=len(x), sync=sync)


# --- multi-worker cells ----------------------------------------------------------------

EXCHANGE_PROBE_ROUNDS = 8


class _ExchangeTimer:
    """DDP comm hook: all-reduce (SUM) each gradient bucket and time it, from the bucket's
    launch (when backward has produced it) to the end of its all-reduce.  Buckets overlap the
    rest of the backward pass, so this is the time exchange was in flight, not the time it
    added to the step (``_exchange_probe`` measures that)."""

    def __init__(self) -> None:
        self.durations: list[float] = []  # of the current step's buckets
        self.per_step: list[float] = []

    def hook(self, state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations: none
        import torch.distributed as dist

        t0 = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(f: Any) -> Any:
            self.durations.append(time.perf_counter() - t0)
            return f.value()[0]

        return fut.then(done)

    def end_step(self) -> None:
        self.per_step.append(sum(self.durations))
        self.durations = []


def _init_process_group(params: dict[str, Any], ctx: distributed.Context, device: torch.device) -> str:
    """Join the cell's process group through a TCP store at MASTER_ADDR:MASTER_PORT.  Rank 0
    binds the store's socket to that address itself (torch's own would listen on every
    interface); torch builds without ``master_listen_fd`` fall back to torch's socket."""
    import torch.distributed as dist

    addr = os.environ.get("MASTER_ADDR", distributed.LOOPBACK)
    port = int(os.environ["MASTER_PORT"])
    timeout = datetime.timedelta(seconds=600)
    backend = "nccl" if device.type == "cuda" else "gloo"
    fd = None
    if ctx.chief:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(128)
        fd = sock.detach()
    try:
        store = dist.TCPStore(addr, port, ctx.world, ctx.chief, timeout, master_listen_fd=fd)
    except TypeError:  # torch < 2.0: no master_listen_fd
        if fd is not None:
            os.close(fd)
        store = dist.TCPStore(addr, port, ctx.world, ctx.chief, timeout)
    dist.init_process_group(backend, store=store, rank=ctx.rank, world_size=ctx.world, timeout=timeout)
    return backend


def _train_workers(params: dict[str, Any], dataset: Dataset, log: EventLog,
                   ctx: distributed.Context) -> TrainOutcome:
    """One worker of a data-parallel cell: DDP, the same global batches on every worker, each
    training on ``batch[rank::world]``; rank 0 alone evaluates."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    device = _device(params)
    backend = _init_process_group(params, ctx, device)
    model = None
    try:
        _reset_peak_memory(device, {**params, "gpus": 1})
        feed = _Feed(params, dataset.train, dataset.shape, device)
        x_train, y_train = feed.x, feed.y
        x_test, y_test = _tensors(dataset.test, dataset.shape, device, params["layout"])
        held = (_tensors(dataset.validation, dataset.shape, device, params["layout"])
                if dataset.validation and ctx.chief else None)
        full = setting(params, "first_layer_backward") == "full"
        gradients = [0]
        net = _net(params, dataset).to(device)
        if params["layout"] == "nhwc":
            net = net.to(memory_format=torch.channels_last)
        model = DistributedDataParallel(net, device_ids=[device.index or 0] if device.type == "cuda" else None)
        timer = _ExchangeTimer()
        model.register_comm_hook(None, timer.hook)
        calibrated = _calibrate(device, backend, ctx)
        _emit_model(log, params, dataset, net)
        optimizer, loss_fn, generator, amp, scaler = _training_kit(params, model, device)
        batch = distributed.global_batch(params)
        iterations = params["iterations"]
        epoch, done = 0, 0
        while (done < iterations) if iterations else (epoch < params["epochs"]):
            starts = distributed.batch_starts(len(y_train), batch, ctx.world, iterations - done if iterations else None)
            if not starts:
                raise HarnessError(f"the training set ({len(y_train)} samples) is smaller than the "
                                   f"{ctx.world} workers")
            steps, loss, accuracy, seconds = _train_epoch_worker(
                model, optimizer, loss_fn, x_train, y_train, ctx, starts, epoch=epoch, generator=generator,
                record=log.steps.append, timer=timer, amp=amp, scaler=scaler,
                channels_last=params["layout"] == "nhwc", feed=feed, input_grad=full, gradients=gradients,
                clock_for=lambda: log.phase_clock(_device_wait(device)))
            done += steps
            validation = None
            if ctx.chief:
                test_loss, test_accuracy, test_seconds = evaluate(net, x_test, y_test, params["eval_batch_size"],
                                                                  amp=amp)
                validation = evaluate(net, *held, params["eval_batch_size"], amp=amp) if held else None
            else:
                test_loss = test_accuracy = test_seconds = None
            log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                      test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                      validation=validation)
            if not math.isfinite(loss):
                return TrainOutcome(diverged=True, notes=[f"training loss became {loss} in epoch {epoch}; stopped"],
                                    model=net, peak_device_memory_bytes=_peak_memory(device, {**params, "gpus": 1}),
                                    exchange=_exchange(timer, log, None), input_gradient_steps=gradients[0],
                                    input_pipeline=feed.describe())
            epoch += 1
        checksum = weights_checksum(net)  # before the probe's passes (no update, but to be plain)
        probe_x, probe_y = feed.probe_batch(batch)
        probe = _exchange_probe(model, loss_fn, probe_x, probe_y, ctx, batch, amp=amp)
        return TrainOutcome(model=net, peak_device_memory_bytes=_peak_memory(device, {**params, "gpus": 1}),
                            exchange=_exchange(timer, log, {**probe, "weights_checksum": checksum,
                                                            "calibration": calibrated}, backend=backend),
                            input_gradient_steps=gradients[0], input_pipeline=feed.describe())
    finally:
        # The DDP wrapper (its reducer holds the comm hook's Python callbacks) must go before the
        # process group: left to the interpreter's exit, it aborted now and then ("terminate
        # called without an active exception", 1 run in 8).
        del model
        gc.collect()
        dist.destroy_process_group()


def _train_epoch_worker(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
                        x: torch.Tensor, y: torch.Tensor, ctx: distributed.Context, starts: list[tuple[int, int]], *,
                        epoch: int, generator: torch.Generator, record: Callable[[StepSample], None],
                        timer: _ExchangeTimer, amp: ContextManager[Any] | None = None,
                        scaler: Any = None, channels_last: bool = False, feed: _Feed | None = None,
                        input_grad: bool = False, gradients: list[int] | None = None,
                        clock_for: Callable[[], StepClock | None] = lambda: None
                        ) -> tuple[int, float, float, float]:
    """``_train_epoch`` of one worker: the global batch at each start, this worker's
    ``[rank::world]`` of it; the loss is divided by the global batch size (``n_local /
    n_global`` × the local mean) and the gradients summed over the workers: the global mean.
    Running loss and accuracy are this worker's.  A loader (``feed.loader``) fetches this
    worker's share of each global batch inside the step's clock; ``input_grad`` as in
    ``_train_epoch``."""
    device = feed.device if feed is not None else x.device
    sync = device.type == "cuda"
    model.train()
    t_epoch = time.perf_counter()
    if feed is not None and feed.loader is not None:
        batches = feed.epoch(starts, generator, rank=ctx.rank, world=ctx.world, input_grad=input_grad)
        fetch = lambda start, size: next(batches)  # noqa: E731  (the loader's order is the starts')
    else:
        xs, ys = _shuffled(x, y, generator, channels_last)
        fetch = None
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    seen = 0
    for start, size in starts:
        clock = clock_for()
        if fetch is None:
            xb = xs[start + ctx.rank:start + size:ctx.world].contiguous(
                memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            yb = ys[start + ctx.rank:start + size:ctx.world].contiguous()
            if input_grad:
                xb = xb.detach().requires_grad_(True)
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
        else:
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            xb, yb = fetch(start, size)
            if clock is not None:
                clock.mark("input+h2d" if sync else "input")
        share = len(yb) / size
        out, loss = _train_step(model, loss_fn, optimizer, amp, scaler, xb, yb, share, sync, clock,
                                backward_phase="backward+exchange")
        t1 = time.perf_counter()
        record((epoch, t0, t1, ctx.recorded_images(size)))
        if clock is not None:
            clock.end()
        timer.end_step()
        loss_sum += loss.detach() * len(yb)
        correct += _hits(out.detach(), yb)
        if input_grad and gradients is not None and xb.grad is not None:
            gradients[0] += 1
        seen += len(yb)
    loss_value, correct_value = loss_sum.item(), correct.item()
    seconds = time.perf_counter() - t_epoch
    return len(starts), loss_value / seen, correct_value / seen, seconds


def _exchange_probe(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    ctx: distributed.Context, batch: int, *, amp: ContextManager[Any] | None,
                    rounds: int = EXCHANGE_PROBE_ROUNDS) -> dict[str, Any]:
    """After training: ``rounds`` forward + backward passes with the gradient all-reduce and as
    many under ``no_sync()`` (none), alternating, each after a barrier (untimed), on the first
    global batch, no update (the model does not change).  The difference of the medians is the
    time the exchange adds to a step, after its overlap with the backward pass (waiting for a
    slower worker included, as in training)."""
    import torch.distributed as dist

    sync = x.device.type == "cuda"
    size = min(batch, len(y))
    xb, yb = x[ctx.rank:size:ctx.world].contiguous(), y[ctx.rank:size:ctx.world].contiguous()
    timed: dict[bool, list[float]] = {True: [], False: []}
    model.train()  # rank 0 has just evaluated; every rank runs the same passes
    for i in range(rounds * 2):
        with_sync = (i % 2 == 0) == (i // 2 % 2 == 0)  # alternate which comes first
        model.zero_grad(set_to_none=True)
        dist.barrier()  # every pass starts together: no drift of one rank into the other's clock
        t0 = time.perf_counter()
        with (contextlib.nullcontext() if with_sync else model.no_sync()):
            if amp is None:
                loss = loss_fn(model(xb), yb)
            else:
                with amp:
                    loss = loss_fn(model(xb), yb)
            loss.backward()
        if sync:
            torch.cuda.synchronize()
        timed[with_sync].append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    synced, alone = statistics.median(timed[True]), statistics.median(timed[False])
    return {"sync_pass_seconds_median": synced, "no_sync_pass_seconds_median": alone,
            "added_seconds": synced - alone, "rounds": rounds}


def _calibrate(device: torch.device, backend: str, ctx: distributed.Context) -> dict[str, Any]:
    """Before training: the process group's all-reduce (SUM, float32) timed over
    ``phases.CALIBRATION_BYTES``, each call after a barrier (docs/MODEL.md).  DDP all-reduces
    its gradient buckets as the backward pass produces them: the exchange overlaps backward."""
    import torch.distributed as dist

    def prepare(size: int) -> Callable[[], None]:
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)

        def call() -> None:
            dist.all_reduce(buffer)
            if device.type == "cuda":
                torch.cuda.synchronize()
        return call

    points = time_collective(prepare, barrier=dist.barrier)
    return calibration(points, pattern="ring all-reduce", transport=backend, workers=ctx.world,
                       overlaps_backward=True)


def weights_checksum(model: nn.Module) -> float:
    """Sum of |w| over the trainable weights: equal on every worker of a synchronous cell."""
    with torch.no_grad():
        return float(sum(p.detach().abs().sum().double().item() for p in model.parameters() if p.requires_grad))


def _exchange(timer: _ExchangeTimer, log: EventLog, probe: dict[str, Any] | None,
              backend: str | None = None) -> dict[str, Any]:
    """The gradient-exchange measurement of this worker (docs/HARNESS.md)."""
    per_step = timer.per_step[log.warmup_steps:] or timer.per_step
    steps = [t1 - t0 for _, t0, t1, _ in (log.steps[log.warmup_steps:] or log.steps)]
    median = statistics.median(per_step) if per_step else None
    step_median = statistics.median(steps) if steps else None
    out: dict[str, Any] = {
        "method": "DDP comm hook: all-reduce of each gradient bucket timed from its launch to its end, "
                  "summed per step (overlaps the backward pass); plus a probe: forward+backward with "
                  "and without (no_sync) the all-reduce, difference of medians",
        "backend": backend,
        "seconds_median": median,
        "fraction_of_step": median / step_median if median is not None and step_median else None,
    }
    if probe:
        out.update(probe)
    return out


# --- models ----------------------------------------------------------------------------


class Block(nn.Module):
    """A ResNet block: main path + (projection or identity) shortcut, summed, then ReLU."""

    def __init__(self, main: nn.Sequential, shortcut: nn.Sequential | None) -> None:
        super().__init__()
        self.main = main
        self.shortcut = shortcut
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.main(x) + (x if self.shortcut is None else self.shortcut(x)))


def build(name: str, shape: tuple[int, int, int], classes: int) -> nn.Sequential:
    """``models.MODELS[name]`` as an ``nn.Sequential`` with one named child per layer entry."""
    try:
        shapes = {info["name"]: info["in"] for info in walk(name, shape, classes)}
    except ValueError as exc:
        raise HarnessError(str(exc)) from exc
    return nn.Sequential(OrderedDict((layer[1], _module(layer, shapes, classes)) for layer in MODELS[name]))


def _module(layer: Layer, shapes: dict[str, tuple[int, ...]], classes: int) -> nn.Module:
    kind, name = layer[0], layer[1]
    if kind == "conv":
        _, _, out, k, stride, pad, bias = layer
        return nn.Conv2d(shapes[name][0], out, kernel_size=k, stride=stride, padding=pad, bias=bias)
    if kind == "bn":
        return nn.BatchNorm2d(shapes[name][0])
    if kind == "relu":
        return nn.ReLU()
    if kind == "maxpool":
        _, _, k, stride, pad = layer
        return nn.MaxPool2d(k, stride=stride, padding=pad)
    if kind == "gap":
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    if kind == "flatten":
        return nn.Flatten()
    if kind == "dense":
        return nn.Linear(shapes[name][0], layer[2] or classes)
    if kind == "dropout":
        return nn.Dropout(layer[2])
    if kind == "block":
        _, _, bkind, width, stride = layer
        main, shortcut = block_layers(name, bkind, shapes[f"{name}_conv1"][0], width, stride)
        seq = lambda sub: nn.Sequential(OrderedDict((s[1], _module(s, shapes, classes)) for s in sub))  # noqa: E731
        return Block(seq(main), seq(shortcut) if shortcut else None)
    raise HarnessError(f"layer kind {kind!r} of {name} is not known to the torch adapter")


def _net(params: dict[str, Any], dataset: Dataset) -> nn.Module:
    """The cell's network: a CNN of ``models.MODELS`` or a transformer (``_torch_transformers``)."""
    if is_transformer(params["model"]):
        fused = setting(params, "attention") != "explicit"  # PyTorch's own modules use the fused kernel
        try:
            return transformers.build(params["model"], dataset.shape, dataset.classes, fused=fused)
        except ValueError as exc:
            raise HarnessError(str(exc)) from exc
    return build(params["model"], dataset.shape, dataset.classes)


def _hits(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Correct predictions in a batch, counted per sample: a sequence's share of its tokens
    whose next token was predicted (so accuracy is next-token accuracy, from 0 to 1)."""
    right = out.argmax(1) == y
    if y.dim() == 1:
        return right.sum()
    return right.flatten(1).to(torch.float64).mean(1).sum()


def _loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The batch's cross-entropy summed over samples (a sequence's: the mean over its tokens)."""
    if y.dim() == 1:
        return nn.functional.cross_entropy(out, y, reduction="sum")
    return nn.functional.cross_entropy(out, y, reduction="none").flatten(1).mean(1).sum()


_COMPILE_TIMES: list[float] | None = None


def _compile_watch() -> list[float] | None:
    """When each of TorchDynamo's compilations (a graph, or a lazily compiled backward) ended,
    by ``time.perf_counter()``: its end-of-compile callback, registered once per process.  None
    where this torch has no such callback."""
    global _COMPILE_TIMES
    if _COMPILE_TIMES is None:
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return None
        times: list[float] = []
        callback_handler.register_end_callback(lambda *_a, **_k: times.append(time.perf_counter()))
        _COMPILE_TIMES = times
    return _COMPILE_TIMES


def _compiled(params: dict[str, Any], model: nn.Module, loss_fn: Any, amp: Any, x: torch.Tensor,
              y: torch.Tensor | None, batch_size: int) -> tuple[nn.Module, dict[str, Any] | None]:
    """``compile = "compiled"``: ``torch.compile(model)``, compiled before the first timed step
    by a forward (and, training, a backward) pass on each batch shape the steps will see — the
    full batch and the last partial one — whose gradients are dropped and whose BatchNorm
    statistics are put back, so training starts from the same state as an eager cell.  Returns
    the model to train and the compilation record (``seconds``, ``shapes``); eager: (model, None)."""
    if setting(params, "compile") != "compiled":
        return model, None
    _compile_watch()
    before = _inductor_cache()
    compiled = torch.compile(model)
    sizes = sorted({min(batch_size, len(x)), len(x) % batch_size} - {0}, reverse=True)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if k in dict(model.named_buffers())}
    training = y is not None
    t0 = time.perf_counter()
    for size in sizes:
        xb = x[:size]
        with contextlib.ExitStack() as stack:
            if amp is not None:
                stack.enter_context(amp)
            if not training:
                stack.enter_context(torch.inference_mode())
            out = compiled(xb)
            if training:
                loss_fn(out, y[:size]).backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    if buffers:
        model.load_state_dict(buffers, strict=False)
    after = _inductor_cache()
    cache = None if before is None or after is None else {k: after[k] - before[k] for k in after}
    return compiled, {"mode": "compiled", "implementation": f"torch.compile (inductor, torch {torch.__version__})",
                      "seconds": round(seconds, 6), "batch_sizes": sizes, "backward": training,
                      **({"cache": {**cache, "state": _cache_state(cache)}} if cache else {})}


def _inductor_cache() -> dict[str, int] | None:
    """Inductor's on-disk cache so far in this process: compiled graphs found there (``hits``:
    its FX-graph and AOT-autograd caches) and compiled afresh (``misses``).  None where this
    torch keeps no such counters."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {"hits": inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"],
            "misses": inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"]}


def _cache_state(cache: dict[str, int]) -> str:
    """"warm": every compiled graph came from the cache; "cold": none did; else "partly warm"."""
    if cache["misses"] == 0 and cache["hits"] > 0:
        return "warm"
    return "cold" if cache["hits"] == 0 else "partly warm"


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _placed(model: nn.Module, params: dict[str, Any], device: torch.device) -> nn.Module:
    model = model.to(device)
    if params["layout"] == "nhwc":
        model = model.to(memory_format=torch.channels_last)
    if device.type == "cuda" and (params["gpus"] or 1) > 1:
        model = nn.DataParallel(model, device_ids=list(range(params["gpus"])))
    return model


def _emit_model(log: EventLog, params: dict[str, Any], dataset: Dataset, model: nn.Module) -> None:
    log.emit("model", name=params["model"], parameters=parameter_count(model),
             flops=model_flops(params["model"], dataset.shape, dataset.classes))


def _weight_layout(asked: str) -> str:
    """The memory format torch really gives a conv weight converted for ``asked``."""
    with torch.random.fork_rng(devices=[]):  # the model's initialisation must not move
        conv = nn.Conv2d(3, 8, 3)
    if asked == "nhwc":
        conv = conv.to(memory_format=torch.channels_last)
    weight = conv.weight
    if weight.is_contiguous():
        return "nchw"
    return "nhwc" if weight.is_contiguous(memory_format=torch.channels_last) else "other"


# --- training and evaluation -----------------------------------------------------------


def _training_kit(params: dict[str, Any], model: nn.Module, device: torch.device) -> tuple[Any, ...]:
    """(optimizer, loss, the cell's seeded generator, autocast or None, gradient scaler or None)."""
    return (_optimizer(params, model), nn.CrossEntropyLoss(), torch.Generator().manual_seed(params["seed"]),
            _autocast(params, device), _grad_scaler() if params["precision"] == "fp16" else None)


def _shuffled(x: torch.Tensor, y: torch.Tensor, generator: torch.Generator,
              channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The epoch's order of the samples (one permutation from the cell's generator: every
    worker of a cell draws the same), in channels-last memory when asked."""
    order = torch.randperm(len(y), generator=generator).to(x.device)
    xs, ys = x[order], y[order]
    if channels_last:
        xs = xs.contiguous(memory_format=torch.channels_last)
    return xs, ys


def _train_step(model: Any, loss_fn: Any, optimizer: Any, amp: Any, scaler: Any, xb: Any, yb: Any,
                share: float, sync: bool, clock: StepClock | None = None,
                backward_phase: str = "backward") -> tuple[Any, Any]:
    """One optimizer step on a batch: forward (under autocast when ``amp``), backward of the
    loss × ``share`` (a DDP worker's share of the global batch: its gradients are then summed
    across workers into the global batch's mean), the step (through the gradient scaler when
    there is one); on a GPU, waits for the device.  Returns (outputs, loss).  ``clock``: a
    sampled step's phase clock, marked after forward (zero_grad included), backward
    (``backward_phase``: "backward+exchange" under DDP, whose bucket all-reduces run inside
    the backward pass) and update."""
    optimizer.zero_grad(set_to_none=True)
    if amp is None:
        out = model(xb)
        loss = loss_fn(out, yb)
    else:
        with amp:
            out = model(xb)
            loss = loss_fn(out, yb)
    if clock is not None:
        clock.mark("forward")
    scaled = loss if share == 1.0 else loss * share
    if scaler is None:
        scaled.backward()
        if clock is not None:
            clock.mark(backward_phase)
        optimizer.step()
    else:
        scaler.scale(scaled).backward()
        if clock is not None:
            clock.mark(backward_phase)
        scaler.step(optimizer)
        scaler.update()
    if clock is not None:
        clock.mark("update")
    if sync:
        torch.cuda.synchronize()
    return out, loss


def _train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
                 x: torch.Tensor, y: torch.Tensor, *, epoch: int, batch_size: int, budget: int | None,
                 generator: torch.Generator, record: Callable[[StepSample], None],
                 amp: ContextManager[Any] | None = None, scaler: torch.amp.GradScaler | None = None,
                 channels_last: bool = False, feed: _Feed | None = None, input_grad: bool = False,
                 gradients: list[int] | None = None,
                 clock_for: Callable[[], StepClock | None] = lambda: None) -> tuple[int, float, float, float]:
    """One pass (or ``budget`` steps) over the shuffled data: (steps, loss, accuracy, seconds).

    Preloaded data: only zero_grad + forward + backward + step sit between the two clock
    readings.  A loader (``feed.loader``): fetching the batch from the DataLoader (and moving
    it to the device) comes first, inside the clock.  The running loss and accuracy stay on
    the device and are read once, at the end.  ``input_grad`` (``first_layer_backward =
    "full"``): the batch requires a gradient, so backward computes the first layer's input
    gradient too; ``gradients[0]`` counts the steps that produced one.  ``clock_for``: the
    next step's phase clock (``log.phase_clock``), None for a step that is not sampled; a
    loader's fetch is the ``input`` phase (``input+h2d`` on a GPU: the loader's batch is
    copied to the device inside the fetch), preloaded tensors have none.
    """
    device = feed.device if feed is not None else x.device
    sync = device.type == "cuda"
    model.train()
    t_epoch = time.perf_counter()
    stop = len(y) if budget is None else min(len(y), budget * batch_size)
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    steps = 0

    def account(out: torch.Tensor, loss: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> None:
        nonlocal loss_sum, correct
        loss_sum += loss.detach() * len(yb)
        correct += _hits(out.detach(), yb)
        if input_grad and gradients is not None and xb.grad is not None:
            gradients[0] += 1

    if feed is not None and feed.loader is not None:
        batches = feed.epoch([(start, min(batch_size, len(y) - start)) for start in range(0, stop, batch_size)],
                             generator, input_grad=input_grad)
        fetched = "input+h2d" if sync else "input"
        while True:
            clock = clock_for()
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            batch = next(batches, None)
            if batch is None:
                break
            if clock is not None:
                clock.mark(fetched)
            xb, yb = batch
            out, loss = _train_step(model, loss_fn, optimizer, amp, scaler, xb, yb, 1.0, sync, clock)
            t1 = time.perf_counter()
            record((epoch, t0, t1, len(yb)))
            if clock is not None:
                clock.end()
            account(out, loss, xb, yb)
            steps += 1
    else:
        xs, ys = _shuffled(x, y, generator, channels_last)
        for start in range(0, stop, batch_size):
            xb, yb = xs[start:start + batch_size], ys[start:start + batch_size]
            if input_grad:
                xb = xb.detach().requires_grad_(True)
            clock = clock_for()
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            out, loss = _train_step(model, loss_fn, optimizer, amp, scaler, xb, yb, 1.0, sync, clock)
            t1 = time.perf_counter()
            record((epoch, t0, t1, len(yb)))
            if clock is not None:
                clock.end()
            account(out, loss, xb, yb)
            steps += 1
    seen = min(stop, len(y))
    loss_value, correct_value = loss_sum.item(), correct.item()
    seconds = time.perf_counter() - t_epoch
    return steps, loss_value / seen, correct_value / seen, seconds


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
             amp: ContextManager[Any] | None = None) -> tuple[float, float, float]:
    """Mean cross-entropy and accuracy over the whole test set, and the seconds it took."""
    sync = x.device.type == "cuda"
    model.eval()
    t0 = time.perf_counter()
    with torch.inference_mode():
        loss_sum = torch.zeros((), device=x.device)
        correct = torch.zeros((), dtype=torch.float64, device=x.device)
        for start in range(0, len(y), batch_size):
            if amp is None:
                out = model(x[start:start + batch_size])
            else:
                with amp:
                    out = model(x[start:start + batch_size]).float()
            yb = y[start:start + batch_size]
            loss_sum += _loss_sum(out, yb)
            correct += _hits(out, yb)
        if sync:
            torch.cuda.synchronize()
        loss_value, correct_value = loss_sum.item(), correct.item()
    seconds = time.perf_counter() - t0
    return loss_value / len(y), correct_value / len(y), seconds


def _optimizer(params: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    lr, decay = params["lr"], params["weight_decay"]
    if params["optimizer"] == "adam":  # momentum applies to SGD only
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=decay)
    if params["optimizer"] == "adadelta":
        return torch.optim.Adadelta(model.parameters(), lr=lr, weight_decay=decay)
    if params["optimizer"] == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=lr, weight_decay=decay)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=params["momentum"], weight_decay=decay)


def _grad_scaler() -> Any:
    """fp16's loss scaler: ``torch.amp.GradScaler`` (torch 2.3+), else ``torch.cuda.amp``'s (1.13)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def _autocast(params: dict[str, Any], device: torch.device) -> ContextManager[Any] | None:
    """The mixed-precision context of the cell (reusable), or None for fp32 / tf32."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params["precision"])
    return None if dtype is None else torch.autocast(device.type, dtype=dtype)


# --- layer profile ---------------------------------------------------------------------


def _layer_op(layer: nn.Module, inp: torch.Tensor, grad: torch.Tensor | None, *, first: bool, training: bool,
              ctx: Callable[[], ContextManager[Any]]) -> LayerOp:
    """Forward of ``layer`` alone on ``inp``; backward alone, given the upstream ``grad``."""
    if not training:
        def forward_only() -> Any:
            with torch.inference_mode(), ctx():
                return layer(inp)
        return LayerOp(forward=forward_only)

    inp = inp if first else inp.requires_grad_(True)
    wrt = ([] if first else [inp]) + [p for p in layer.parameters() if p.requires_grad]

    def forward() -> Any:
        with ctx():
            return layer(inp)

    if not wrt:
        return LayerOp(forward=forward)
    out = forward()  # kept: the graph that every backward call runs through again

    def backward() -> Any:
        return torch.autograd.grad(out, wrt, grad, retain_graph=True)

    return LayerOp(forward=forward, backward=backward)


# --- data and devices ------------------------------------------------------------------


def _tensors(split: Split, shape: tuple[int, int, int], device: torch.device, layout: str = "nchw",
             limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 images normalised to [-1, 1] (mean 0.5, std 0.5 after /255) and int64 labels;
    for token data (``TokenSplit``) int64 inputs and targets, (count, seq_len) each."""
    if isinstance(split, TokenSplit):
        import numpy as np
        xs, ys = split.arrays(np, limit or 0)
        return torch.from_numpy(xs).long().to(device), torch.from_numpy(ys).long().to(device)
    count = split.count if limit is None else min(limit, split.count)
    images, labels = split.images, split.labels
    if count < split.count:
        images, labels = images[:count * shape[0] * shape[1] * shape[2]], labels[:count]
    pixels = torch.frombuffer(bytearray(images), dtype=torch.uint8)
    x = pixels.view(count, *shape).to(torch.float32).div_(255.0).sub_(0.5).div_(0.5)
    y = torch.frombuffer(bytearray(labels), dtype=torch.int64).clone()
    x = x.to(device)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y.to(device)


def _pixels(split: Split, shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The split as it is stored: uint8 images (N, C, H, W) and int64 labels, on the CPU."""
    x = torch.frombuffer(bytearray(split.images), dtype=torch.uint8).view(split.count, *shape)
    y = torch.frombuffer(bytearray(split.labels), dtype=torch.int64).clone()
    return x, y


class _Images(torch.utils.data.Dataset):
    """What the loader reads: the stored bytes, each sample converted when it is fetched —
    float, /255, mean 0.5 / std 0.5 (torchvision's ``ToTensor`` + ``Normalize``), the same
    numbers as the preloaded tensors."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor) -> None:
        self.pixels, self.labels = pixels, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pixels[index].to(torch.float32).div_(255.0).sub_(0.5).div_(0.5), self.labels[index]


def _collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The batch, stacked, and the id of the loader worker that made it (-1: the training process)."""
    info = torch.utils.data.get_worker_info()
    return (torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]),
            -1 if info is None else info.id)


class _Batches(torch.utils.data.Sampler):
    """The loader's batch sampler: the index lists of the current epoch, set by ``_Feed.epoch``."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _Feed:
    """What feeds the training steps (``input_pipeline``).

    ``preloaded``: ``x`` / ``y`` are the normalised training tensors on the device; the epoch
    loop slices them.  ``loader``: ``x`` / ``y`` are the stored uint8 images and labels (CPU)
    and ``loader`` a ``torch.utils.data.DataLoader`` over them with ``loader_workers`` worker
    processes (0: in this process), whose batch sampler is set each epoch from the same seeded
    permutation the preloaded path draws — so both paths train on the same batches; the
    epoch's iterator (which starts the workers, ``persistent_workers`` off as by default) is
    made before the first step, each batch is fetched inside its step's clock.
    """

    def __init__(self, params: dict[str, Any], split: Split, shape: tuple[int, int, int],
                 device: torch.device) -> None:
        self.device, self.shape = device, shape
        self.channels_last = params["layout"] == "nhwc"
        self.workers = setting(params, "loader_workers")
        self.loader: Any = None
        self.seen: dict[int, int] = {}  # loader worker id (-1: this process) -> batches it made
        self.batches = 0
        if setting(params, "input_pipeline") != "loader":
            self.x, self.y = _tensors(split, shape, device, params["layout"])
            return
        self.x, self.y = _pixels(split, shape)
        self.sampler = _Batches()
        self.loader = torch.utils.data.DataLoader(
            _Images(self.x, self.y), batch_sampler=self.sampler, num_workers=self.workers,
            collate_fn=_collate, pin_memory=device.type == "cuda",
            # its own generator: the workers' base seed must not draw from the model's RNG
            generator=torch.Generator().manual_seed(params["seed"]))

    def epoch(self, starts: list[tuple[int, int]], generator: torch.Generator, *, rank: int = 0,
              world: int = 1, input_grad: bool = False) -> Any:
        """The epoch's batches (this worker's ``[rank::world]`` share of each global batch at
        ``starts``), on the device, as an iterator whose ``next`` fetches one."""
        order = torch.randperm(len(self.y), generator=generator).tolist()
        self.sampler.batches = [order[start + rank:start + size:world] for start, size in starts]
        return self._fetch(iter(self.loader), input_grad)

    def _fetch(self, batches: Any, input_grad: bool) -> Any:
        for xb, yb, worker in batches:
            self.seen[worker] = self.seen.get(worker, 0) + 1
            self.batches += 1
            xb = xb.to(self.device, non_blocking=True)
            if self.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            if input_grad:
                xb.requires_grad_(True)
            yield xb, yb.to(self.device, non_blocking=True)

    def probe_batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised tensors on the device holding at least the first ``size`` samples."""
        if self.loader is None:
            return self.x, self.y
        x, y = self.x[:size], self.y[:size]
        return x.to(torch.float32).div_(255.0).sub_(0.5).div_(0.5).to(self.device), y.to(self.device)

    def describe(self) -> dict[str, Any]:
        """The summary's ``input_pipeline``: what really fed the steps."""
        if self.loader is None:
            return {"kind": "preloaded"}
        return {"kind": "loader", "implementation": "torch.utils.data.DataLoader", "workers": self.workers,
                "workers_seen": len([w for w in self.seen if w >= 0]), "batches": self.batches,
                "batches_in_process": self.seen.get(-1, 0), "pin_memory": self.device.type == "cuda"}


def _asked_device(params: dict[str, Any]) -> str:
    return "cuda:0" if params["device"] == "gpu" else "cpu"


def _usable_device(asked: str) -> str:
    """The device this process can really use for ``asked``: itself, or cpu without CUDA."""
    return "cpu" if asked.startswith("cuda") and not torch.cuda.is_available() else asked


def _device(params: dict[str, Any]) -> torch.device:
    """The cell's torch device, or HarnessError when this environment cannot use it."""
    device = torch.device(_asked_device(params))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError(f"device {params['device']!r} was asked but CUDA is not available in this environment "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})")
    return device


def _device_wait(device: torch.device) -> Callable[[], None] | None:
    """What a sampled step's clock waits for before each reading: the GPU's queue (None on the
    CPU, where every operation has finished when it returns)."""
    return torch.cuda.synchronize if device.type == "cuda" else None


def _reset_peak_memory(device: torch.device, params: dict[str, Any]) -> None:
    if device.type == "cuda":
        for i in range(params["gpus"] or 1):
            torch.cuda.reset_peak_memory_stats(i)


def _peak_memory(device: torch.device, params: dict[str, Any]) -> int | None:
    """Peak allocated bytes summed over the GPUs used; None on the CPU."""
    if device.type != "cuda":
        return None
    return sum(torch.cuda.max_memory_allocated(i) for i in range(params["gpus"] or 1))


def _js(flag: bool) -> str:
    return "true" if flag else "false"
