"""PyTorch adapter (framework ``torch``): LeNet-5 on in-memory tensors, timed per step.

Data: pixels / 255, then normalised with mean 0.5 and std 0.5 (values in [-1, 1]) for
every dataset, so that the same cell means the same input across datasets and frameworks.
Each epoch reshuffles the whole training set with a seeded ``torch.Generator`` and slices
batches out of it; the last partial batch is kept.  No DataLoader, no worker processes.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from torch import nn

from ..data import Dataset, Split
from ..events import EventLog, StepSample
from .. import HarnessError
from . import TrainOutcome

NAME = "torch"
MODELS = ("lenet5",)
LENET5_MIN_SIDE = 12  # 12 -> conv(pad 2) 12 -> pool 6 -> conv 2 -> pool 1


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    if params["model"] not in MODELS:
        return f"[params -> model] unknown model {params['model']!r} for torch (known: {', '.join(MODELS)})"
    if params["dataset"] == "synthetic":
        _, h, w = params["synthetic_shape"]
        if min(h, w) < LENET5_MIN_SIDE:
            return (f"[params -> synthetic_shape] lenet5 needs images of at least "
                    f"{LENET5_MIN_SIDE}×{LENET5_MIN_SIDE} pixels, got {h}×{w}")
    return None


def configure(params: dict[str, Any]) -> None:
    """Apply threads, oneDNN and the seed; inter-op threads first, before any parallel work."""
    if params["interop_threads"] != "unset":
        try:
            torch.set_num_interop_threads(params["interop_threads"])
        except RuntimeError:
            pass  # already started: probe reports the count in force as a mismatch
    if params["threads"] != "unset":
        torch.set_num_threads(params["threads"])
    torch.backends.mkldnn.enabled = params["onednn"]
    torch.manual_seed(params["seed"])


def probe(params: dict[str, Any]) -> dict[str, Any]:
    used = _usable_device(params["device"])
    in_force = {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "onednn": bool(torch.backends.mkldnn.enabled),
        "onednn_available": bool(torch.backends.mkldnn.is_available()),
        "mkl_available": bool(torch.backends.mkl.is_available()),
        "cuda_available": bool(torch.cuda.is_available()),
        "device": used,
    }
    mismatches = []
    for key in ("threads", "interop_threads"):
        if params[key] != "unset" and params[key] != in_force[key]:
            mismatches.append(f"{key}: asked {params[key]}, in force {in_force[key]}")
    if params["onednn"] != in_force["onednn"]:
        mismatches.append(f"onednn: asked {_js(params['onednn'])}, in force {_js(in_force['onednn'])}")
    elif params["onednn"] and not in_force["onednn_available"]:
        mismatches.append("onednn: asked true, but this torch build has no oneDNN")
    if torch.device(params["device"]) != torch.device(used):
        mismatches.append(f"device: asked {params['device']}, in force {used}")
    return {
        "framework_version": torch.__version__,
        "build": torch.__config__.show(),
        "in_force": in_force,
        "mismatches": mismatches,
    }


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    device = _device(params["device"])
    x_train, y_train = _tensors(dataset.train, dataset.shape, device)
    x_test, y_test = _tensors(dataset.test, dataset.shape, device)
    model = lenet5(dataset.shape, dataset.classes).to(device)
    log.emit("model", name=params["model"], parameters=parameter_count(model))
    optimizer = _optimizer(params, model)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(params["seed"])
    iterations = params["iterations"]

    epoch, done = 0, 0
    while (done < iterations) if iterations else (epoch < params["epochs"]):
        budget = iterations - done if iterations else None
        steps, loss, accuracy, seconds = _train_epoch(
            model, optimizer, loss_fn, x_train, y_train, epoch=epoch, batch_size=params["batch_size"],
            budget=budget, generator=generator, record=log.steps.append)
        done += steps
        test_loss, test_accuracy, test_seconds = evaluate(model, x_test, y_test, params["eval_batch_size"])
        diverged = not math.isfinite(loss)
        log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                  test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds)
        if diverged:
            return TrainOutcome(diverged=True, notes=[f"training loss became {loss} in epoch {epoch}; stopped"])
        epoch += 1
    return TrainOutcome()


# --- model -----------------------------------------------------------------------------


def lenet5(shape: tuple[int, int, int], classes: int) -> nn.Sequential:
    """LeNet-5: conv 5×5 (pad 2) 6 → ReLU → pool 2 → conv 5×5 16 → ReLU → pool 2 → fc 120 → 84 → classes."""
    c, h, w = shape
    if min(h, w) < LENET5_MIN_SIDE:
        raise HarnessError(f"lenet5 needs images of at least {LENET5_MIN_SIDE}×{LENET5_MIN_SIDE} pixels, got {h}×{w}")
    flat = 16 * ((h // 2 - 4) // 2) * ((w // 2 - 4) // 2)
    return nn.Sequential(
        nn.Conv2d(c, 6, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, classes),
    )


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --- training and evaluation -----------------------------------------------------------


def _train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
                 x: torch.Tensor, y: torch.Tensor, *, epoch: int, batch_size: int, budget: int | None,
                 generator: torch.Generator, record: Callable[[StepSample], None]
                 ) -> tuple[int, float, float, float]:
    """One pass (or ``budget`` steps) over the shuffled data: (steps, loss, accuracy, seconds).

    Only zero_grad + forward + backward + step sit between the two clock readings; the
    running loss and accuracy stay on the device and are read once, at the end.
    """
    sync = x.device.type == "cuda"
    model.train()
    t_epoch = time.perf_counter()
    order = torch.randperm(len(y), generator=generator).to(x.device)
    xs, ys = x[order], y[order]
    stop = len(y) if budget is None else min(len(y), budget * batch_size)
    loss_sum = torch.zeros((), device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    steps = 0
    for start in range(0, stop, batch_size):
        xb, yb = xs[start:start + batch_size], ys[start:start + batch_size]
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out = model(xb)
        loss = loss_fn(out, yb)
        loss.backward()
        optimizer.step()
        if sync:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        record((epoch, t0, t1, len(yb)))
        loss_sum += loss.detach() * len(yb)
        correct += (out.detach().argmax(1) == yb).sum()
        steps += 1
    seen = min(stop, len(y))
    loss_value, correct_value = loss_sum.item(), correct.item()
    seconds = time.perf_counter() - t_epoch
    return steps, loss_value / seen, correct_value / seen, seconds


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, float, float]:
    """Mean cross-entropy and accuracy over the whole test set, and the seconds it took."""
    sync = x.device.type == "cuda"
    model.eval()
    t0 = time.perf_counter()
    with torch.inference_mode():
        loss_sum = torch.zeros((), device=x.device)
        correct = torch.zeros((), dtype=torch.int64, device=x.device)
        for start in range(0, len(y), batch_size):
            out = model(x[start:start + batch_size])
            yb = y[start:start + batch_size]
            loss_sum += nn.functional.cross_entropy(out, yb, reduction="sum")
            correct += (out.argmax(1) == yb).sum()
        if sync:
            torch.cuda.synchronize()
        loss_value, correct_value = loss_sum.item(), correct.item()
    seconds = time.perf_counter() - t0
    return loss_value / len(y), correct_value / len(y), seconds


def _optimizer(params: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    if params["optimizer"] == "adam":  # momentum does not apply to Adam
        return torch.optim.Adam(model.parameters(), lr=params["lr"], weight_decay=params["weight_decay"])
    return torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=params["momentum"],
                           weight_decay=params["weight_decay"])


# --- data and devices ------------------------------------------------------------------


def _tensors(split: Split, shape: tuple[int, int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 images normalised to [-1, 1] (mean 0.5, std 0.5 after /255) and int64 labels."""
    pixels = torch.frombuffer(bytearray(split.images), dtype=torch.uint8)
    x = pixels.view(split.count, *shape).to(torch.float32).div_(255.0).sub_(0.5).div_(0.5)
    y = torch.frombuffer(bytearray(split.labels), dtype=torch.int64).clone()
    return x.to(device), y.to(device)


def _usable_device(asked: str) -> str:
    """The device this process can really use for ``asked``: itself, or cpu without CUDA."""
    try:
        kind = torch.device(asked).type
    except RuntimeError:
        return "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        return "cpu"
    return asked if kind in ("cpu", "cuda") else "cpu"


def _device(asked: str) -> torch.device:
    """``asked`` as a torch device, or HarnessError when this environment cannot use it."""
    try:
        device = torch.device(asked)
    except RuntimeError as exc:
        raise HarnessError(f"device {asked!r} is not a torch device: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError(f"device {asked!r} was asked but CUDA is not available in this environment "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})")
    if device.type not in ("cpu", "cuda"):
        raise HarnessError(f"device {asked!r} is not supported by the torch adapter (use cpu or cuda)")
    return device


def _js(flag: bool) -> str:
    return "true" if flag else "false"
