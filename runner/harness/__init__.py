"""The in-cell harness: runs one cell inside a framework environment and writes events.

Launched by the host as ``python -m matrun.runner.harness --spec DIR/spec.json --out DIR``
(see ``__main__``); ``run_cell`` is the same thing as a function.  It reads ``spec.json``,
checks it, applies the framework's switches through the framework's adapter, probes what
is really in force, loads the data, trains, evaluates and writes ``events.jsonl``
(docs/BUNDLE.md, docs/HARNESS.md).

This package runs where nothing of matrun's host side is installed: it imports the
standard library, its own modules and, inside an adapter, the framework.  Nothing else.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

HARNESS_VERSION = "1.0"
SCHEMA_VERSION = 1
UNSET = "unset"
OPTIMIZERS = ("sgd", "adam", "adadelta", "rmsprop")
MODES = ("train", "inference")
DEVICES = ("cpu", "gpu")
LAYOUTS = ("nchw", "nhwc")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
CONV_ALGOS = ("heuristic", "autotune")
PRESETS = ("none", "framework-default")


class HarnessError(Exception):
    """A failure the user can act on (missing data, unusable device); exit code 1."""


class SpecError(HarnessError):
    """``spec.json`` is unreadable, of an unknown version, or asks for something unknown; exit code 2."""


class DataError(HarnessError):
    """A dataset is missing or its files are not what they claim to be."""


# --- spec.json -------------------------------------------------------------------------


def _show(value: Any) -> str:
    """A value as JSON would spell it, for messages."""
    text = json.dumps(value) if isinstance(value, (str, bool)) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_at_least(minimum: int) -> Callable[[Any], str | None]:
    words = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")

    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        return None if ok else f"expected {words}, got {_show(value)}"

    return check


def _number_at_least(minimum: float, *, strict: bool) -> Callable[[Any], str | None]:
    words = f"a number {'>' if strict else '>='} {minimum:g}"

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return f"expected {words}, got {_show(value)}"
        ok = value > minimum if strict else value >= minimum
        return None if ok and value != float("inf") else f"expected {words}, got {_show(value)}"

    return check


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string, got {_show(value)}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {_show(value)}"


def _choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value in options and isinstance(value, str):
            return None
        return f"expected one of {', '.join(json.dumps(o) for o in options)}, got {_show(value)}"

    return check


def _threads(value: Any) -> str | None:
    if value == UNSET or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return f'expected a positive integer or "unset", got {_show(value)}'


def _shape(value: Any) -> str | None:
    if (isinstance(value, list) and len(value) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
        return None
    return f"expected [channels, height, width] (three positive integers), got {_show(value)}"


def _epochs(value: Any) -> str | None:
    return None if value is None else _int_at_least(1)(value)


def _model(value: Any) -> str | None:
    from .models import MODELS as ZOO

    return _choice(tuple(ZOO))(value)


def _cpuset(value: Any) -> str | None:
    from .probe import parse_cpuset

    if not isinstance(value, str):
        return f"expected a CPU list such as \"0-1,3\" or \"\", got {_show(value)}"
    try:
        parse_cpuset(value)
    except ValueError as exc:
        return str(exc)
    return None


# Every key of ``params`` the harness reads, with its check (None: fine, else the problem).
# Keys that are not listed (``timeout``, future host-side settings) are ignored.
PARAM_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "framework": _string,
    "variant": _string,
    "device": _choice(DEVICES),
    "gpus": _int_at_least(1),
    "mode": _choice(MODES),
    "model": _model,
    "dataset": _string,
    "synthetic_shape": _shape,
    "synthetic_classes": _int_at_least(2),
    "synthetic_train": _int_at_least(1),
    "synthetic_test": _int_at_least(1),
    "train_limit": _int_at_least(0),
    "test_limit": _int_at_least(0),
    "epochs": _epochs,
    "iterations": _int_at_least(0),
    "batch_size": _int_at_least(1),
    "eval_batch_size": _int_at_least(1),
    "optimizer": _choice(OPTIMIZERS),
    "lr": _number_at_least(0.0, strict=True),
    "momentum": _number_at_least(0.0, strict=False),
    "weight_decay": _number_at_least(0.0, strict=False),
    "warmup_steps": _int_at_least(0),
    "threads": _threads,
    "interop_threads": _threads,
    "cpuset": _cpuset,
    "onednn": _boolean,
    "layout": _choice(LAYOUTS),
    "precision": _choice(PRECISIONS),
    "conv_algo": _choice(CONV_ALGOS),
    "layer_profile": _boolean,
    "preset": _choice(PRESETS),
    "onednn_check": _boolean,
    "seed": _int_at_least(0),
}

# Keys added after the first harness: checked when present; absent, they mean this default (a
# spec of an older host, or of a tool that knows nothing of multi-worker cells, still reads;
# readers use ``params.get``).
OPTIONAL_PARAMS: dict[str, tuple[Any, Callable[[Any], str | None]]] = {
    "workers": (1, _int_at_least(1)),
    "nodes": (1, _int_at_least(1)),
    "scaling": ("weak", _choice(("weak", "strong"))),
    "kvstore": ("device", _choice(("device", "dist_sync", "dist_async"))),
}


def _unused_keys(params: dict[str, Any]) -> set[str]:
    """Keys the host sets to null because the cell does not use them (docs/BUNDLE.md)."""
    unused = set()
    if params.get("dataset") != "synthetic":
        unused |= {"synthetic_shape", "synthetic_classes", "synthetic_train", "synthetic_test"}
    if params.get("mode") == "inference":
        unused |= {"optimizer", "lr", "momentum", "weight_decay", "epochs"}
    elif params.get("optimizer") != "sgd":
        unused.add("momentum")
    if params.get("device") == "cpu":
        unused.add("gpus")
    if params.get("framework") != "mxnet":
        unused.add("kvstore")
    return unused


# (C, H, W) of the files of each real dataset; synthetic data has ``synthetic_shape``.
DATASET_SHAPES = {"fashion-mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def input_shape(params: dict[str, Any]) -> tuple[int, int, int] | None:
    """The (C, H, W) the cell's dataset will have, or None when it is not known before loading."""
    if params["dataset"] == "synthetic":
        return tuple(params["synthetic_shape"])  # type: ignore[return-value]
    return DATASET_SHAPES.get(params["dataset"])


def model_problem(params: dict[str, Any]) -> str | None:
    """``"[params -> key] ..."`` when the model cannot take the dataset's input size, else None."""
    from .models import walk

    shape = input_shape(params)
    if shape is None:
        return None
    try:
        for _ in walk(params["model"], shape, 2):
            pass
    except ValueError as exc:
        key = "synthetic_shape" if params["dataset"] == "synthetic" else "model"
        return f"[params -> {key}] {exc}"
    return None


def sequential_models() -> tuple[str, ...]:
    """Models without residual blocks: the ones whose layers can be timed one by one."""
    from .models import MODELS as ZOO

    return tuple(name for name, layers in ZOO.items() if all(layer[0] != "block" for layer in layers))


def load_spec(path: Path) -> dict[str, Any]:
    """Read and check ``spec.json``; raise ``SpecError`` naming the file and the key path."""
    from .adapters import known_frameworks
    from .datasets import DATASETS

    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: expected a JSON object, got {type(spec).__name__}")
    version = spec.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SpecError(f"{path}: unknown schema_version {_show(version)} "
                        f"(this harness reads {SCHEMA_VERSION}); rebuild the environment with this matrun")
    for key, check in (("data_dir", _string), ("params", None)):
        if key not in spec:
            raise SpecError(f"{path}: [{key}] is missing")
        problem = check(spec[key]) if check else (
            None if isinstance(spec[key], dict) else f"expected an object, got {_show(spec[key])}")
        if problem:
            raise SpecError(f"{path}: [{key}] {problem}")
    params = spec["params"]
    unused = _unused_keys(params)
    for key, check in PARAM_CHECKS.items():
        if key not in params:
            raise SpecError(f"{path}: [params -> {key}] is missing")
        if key in unused and params[key] is None:
            continue
        problem = check(params[key])
        if problem:
            raise SpecError(f"{path}: [params -> {key}] {problem}")
    for key, (_default, check) in OPTIONAL_PARAMS.items():
        if key not in params or (key in unused and params[key] is None):
            continue
        problem = check(params[key])
        if problem:
            raise SpecError(f"{path}: [params -> {key}] {problem}")
    if params["framework"] not in known_frameworks():
        raise SpecError(f"{path}: [params -> framework] unknown framework {_show(params['framework'])} "
                        f"(this harness knows {', '.join(known_frameworks())})")
    if params["dataset"] not in DATASETS:
        raise SpecError(f"{path}: [params -> dataset] unknown dataset {_show(params['dataset'])} "
                        f"(expected one of {', '.join(DATASETS)})")
    if params["mode"] == "train" and params["iterations"] == 0 and params["epochs"] is None:
        raise SpecError(f"{path}: [params -> epochs] must be a positive integer when iterations is 0")
    problem = model_problem(params)
    if problem:
        raise SpecError(f"{path}: {problem}")
    if params["layer_profile"] and params["model"] not in sequential_models():
        raise SpecError(f"{path}: [params -> layer_profile] needs a sequential network "
                        f"({', '.join(sequential_models())}), not {params['model']}")
    from .distributed import multi_process

    if multi_process(params) and (params["mode"] != "train" or params["layer_profile"]):
        raise SpecError(f"{path}: [params -> workers] a multi-worker cell trains (mode = \"train\", "
                        "no layer_profile)")
    return spec


# --- one run ---------------------------------------------------------------------------


def run_cell(*, spec_path: Path, out_dir: Path, started: float | None = None,
             onednn_probe: bool = False) -> dict[str, Any]:
    """Run the cell that ``spec_path`` describes, write ``out_dir/events.jsonl``, return the summary.

    ``started`` is the ``time.perf_counter()`` reading taken when the harness started (it
    anchors ``time_to_first_step``); by default, now.  Raises ``SpecError`` before anything
    is written when the spec is bad, ``HarnessError`` (or anything else) once running, in
    which case the events written so far stay on disk.  ``onednn_probe``: this run is the
    short verbose run of another run's oneDNN check (``probe.onednn_check``); it never
    starts a check of its own.
    """
    from . import adapters, datasets, distributed, layers, probe
    from .events import EventLog

    started = time.perf_counter() if started is None else started
    spec = load_spec(spec_path)
    params = spec["params"]
    try:
        ctx = distributed.context(params)
    except ValueError as exc:
        raise HarnessError(f"{spec_path}: {exc}") from None
    # A worker applies its share of the cell's threads and CPUs (the cell's values when alone).
    params = distributed.worker_params(params, ctx.local_rank) if ctx.distributed else params
    distributed.set_current(ctx)
    adapter = adapters.load(params["framework"])
    problem = adapter.check(params)
    if not problem and params["mode"] == "inference" and not hasattr(adapter, "infer"):
        problem = f"[params -> mode] the {params['framework']} adapter has no inference mode"
    if not problem and params["layer_profile"] and not hasattr(adapter, "layer_ops"):
        problem = f"[params -> layer_profile] the {params['framework']} adapter cannot time layers"
    if problem:
        raise SpecError(f"{spec_path}: {problem}")

    onednn = None
    if params["onednn_check"] and not onednn_probe and ctx.chief:
        onednn = probe.onednn_check({**spec, "params": params})
        started += onednn["seconds"]  # time_to_first_step leaves the check out

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with EventLog(out_dir / "events.jsonl", warmup_steps=params["warmup_steps"], started=started,
                  harness_version=HARNESS_VERSION) as log:
        adapter.configure(params)
        fields = probe.collect(adapter.NAME, params, adapter.probe(params))
        notes = probe.add_onednn_check(fields, params, onednn)
        log.emit("probe", **fields)

        t0 = time.perf_counter()
        dataset = datasets.load(params, Path(spec["data_dir"]))
        log.emit("data", dataset=dataset.name, train_size=dataset.train.count,
                 test_size=dataset.test.count, shape=list(dataset.shape), classes=dataset.classes,
                 load_seconds=time.perf_counter() - t0)

        if params["mode"] == "inference":
            outcome = adapter.infer(params, dataset, log)
        else:
            outcome = adapter.train(params, dataset, log)
        if params["layer_profile"]:
            layers.profile(log, params, dataset.shape, dataset.classes,
                           adapter.layer_ops(params, dataset, outcome.model))
        extra, more_notes = _workers_summary(ctx, params, log, fields, outcome, out_dir)
        summary = log.summary(diverged=outcome.diverged, notes=[*notes, *outcome.notes, *more_notes],
                              mode=params["mode"], inference_seconds=outcome.inference_seconds,
                              peak_device_memory_bytes=outcome.peak_device_memory_bytes, extra=extra)
        log.emit("end", t=time.time())
    return summary


def _workers_summary(ctx: Any, params: dict[str, Any], log: Any, probe_fields: dict[str, Any], outcome: Any,
                     out_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A worker of a multi-worker cell: its report (rank r > 0 writes ``worker.json``; rank 0
    gathers them all) and, for rank 0, the summary fields of the whole cell.  A single
    process: only the gradient-exchange measurement, when there is one (an MXNet dist kvstore)."""
    from . import distributed

    exchange = {"exchange": outcome.exchange} if outcome.exchange else {}
    if not ctx.distributed:
        return exchange, []
    in_force = probe_fields.get("in_force", {})
    report = {"rank": ctx.rank, "local_rank": ctx.local_rank, "node_rank": ctx.node_rank,
              **distributed.step_stats(ctx, log.steps, params["warmup_steps"]),
              "affinity": in_force.get("affinity"), "threads": in_force.get("threads"),
              "interop_threads": in_force.get("interop_threads"),
              "mismatches": probe_fields.get("mismatches", []), "exchange": outcome.exchange}
    if not ctx.chief:
        distributed.write_report(out_dir, report)
        return {**exchange, "rank": ctx.rank}, []
    reports, notes = distributed.gather_reports(ctx, report)
    rated = log.steps[log.warmup_steps:] or log.steps
    from .events import throughput

    extra = distributed.summary_fields(ctx, params, reports, throughput(rated))
    return {**exchange, **extra}, notes
