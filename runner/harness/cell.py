"""One cell, in-cell: read and check ``spec.json``, then run it and write ``events.jsonl``.

``run_cell`` is what ``python -m matrun.runner.harness`` does (``__main__``): it checks the
spec (``load_spec``), applies the framework's switches through the framework's adapter,
probes what is really in force, loads the data, trains or infers, evaluates and writes the
events (docs/BUNDLE.md, docs/HARNESS.md).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from . import adapters, datasets, distributed, layers, probe
from .errors import HarnessError, SpecError
from .events import EventLog, inside_steps, throughput
from .models import is_language_model
from .spec import first_problem, knob_problem, layer_profile_problem, model_problem, setting, show

HARNESS_VERSION = "1.0"
SCHEMA_VERSION = 1


# --- spec.json -------------------------------------------------------------------------


def load_spec(path: Path) -> dict[str, Any]:
    """Read and check ``spec.json``; raise ``SpecError`` naming the file and the key path."""
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
        raise SpecError(f"{path}: unknown schema_version {show(version)} "
                        f"(this harness reads {SCHEMA_VERSION}); rebuild the environment with this matrun")
    if "data_dir" not in spec:
        raise SpecError(f"{path}: [data_dir] is missing")
    if not isinstance(spec["data_dir"], str):
        raise SpecError(f"{path}: [data_dir] expected a string, got {show(spec['data_dir'])}")
    if "params" not in spec:
        raise SpecError(f"{path}: [params] is missing")
    if not isinstance(spec["params"], dict):
        raise SpecError(f"{path}: [params] expected an object, got {show(spec['params'])}")
    params = spec["params"]
    problem = first_problem(params)
    if problem:
        raise SpecError(f"{path}: [params -> {problem[0]}] {problem[1]}")
    known = adapters.known_frameworks()
    if params["framework"] not in known:
        raise SpecError(f"{path}: [params -> framework] unknown framework {show(params['framework'])} "
                        f"(this harness knows {', '.join(known)})")
    problem_text = model_problem(params)
    if problem_text:
        raise SpecError(f"{path}: {problem_text}")
    problem_text = layer_profile_problem(params)
    if problem_text:
        raise SpecError(f"{path}: [params -> layer_profile] {problem_text}")
    knob = knob_problem(params)
    if knob:
        raise SpecError(f"{path}: [params -> {knob[0]}] {knob[1]}")
    if distributed.multi_process(params) and (params["mode"] != "train" or params["layer_profile"]):
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
    # the bundle's file names: warehouse/bundles/layout.py (the harness cannot import it)
    every = setting(params, "phase_sampling") if params["mode"] == "train" else 0
    with EventLog(out_dir / "events.jsonl", warmup_steps=params["warmup_steps"], started=started,
                  harness_version=HARNESS_VERSION, phase_every=every) as log:
        adapter.configure(params)
        fields = probe.collect(adapter.NAME, params, adapter.probe(params))
        notes = probe.add_onednn_check(fields, params, onednn)
        log.emit("probe", **fields)

        t0 = time.perf_counter()
        dataset = datasets.load(params, Path(spec["data_dir"]))
        held = {"validation_size": dataset.validation.count} if dataset.validation else {}
        log.emit("data", dataset=dataset.name, train_size=dataset.train.count,
                 test_size=dataset.test.count, shape=list(dataset.shape), classes=dataset.classes,
                 load_seconds=time.perf_counter() - t0, **held)

        if params["mode"] == "inference":
            outcome = adapter.infer(params, dataset, log)
        else:
            outcome = adapter.train(params, dataset, log)
        if params["layer_profile"]:
            ops = adapter.layer_ops(params, dataset, outcome.model)
            layers.profile(log, params, dataset.shape, dataset.classes, ops)
            outcome.notes.extend(ops.notes)
        extra, more_notes = _workers_summary(ctx, params, log, fields, outcome, out_dir)
        if params["mode"] != "inference":
            extra = {**_knobs_summary(params, outcome, log.model), **extra}
        extra = {**extra, **_model_summary(params, dataset, log, outcome, extra.get("throughput"))}
        summary = log.summary(diverged=outcome.diverged, notes=[*notes, *outcome.notes, *more_notes],
                              mode=params["mode"], inference_seconds=outcome.inference_seconds,
                              peak_device_memory_bytes=outcome.peak_device_memory_bytes, extra=extra)
        log.emit("end", t=time.time())
    return summary


def _model_summary(params: dict[str, Any], dataset: datasets.Dataset, log: EventLog,
                   outcome: adapters.TrainOutcome, aggregate: float | None) -> dict[str, Any]:
    """The summary fields of the transformers and of compilation: ``compilation`` (seconds
    spent compiling before the first step, kept out of the throughput) when the cell compiled,
    with ``compiles`` (the compilations the framework reported during the run) and
    ``in_steps`` (those that ended while a step ran; 0: no step paid for one), both absent
    where the framework reports none;
    for a language model ``seq_len``, ``tokens_per_second`` (the throughput, in sequences/s,
    × ``seq_len``; ``aggregate``: a multi-worker cell's summed throughput), and ``test_loss`` /
    ``perplexity`` (exp of the mean next-token loss)."""
    out: dict[str, Any] = {}
    if outcome.compilation is not None:
        out["compilation"] = dict(outcome.compilation)
        if outcome.compile_times is not None:
            out["compilation"].update(compiles=len(outcome.compile_times),
                                      in_steps=inside_steps(outcome.compile_times, log.steps))
    if is_language_model(params["model"]):
        seq_len = dataset.shape[0]
        rate = aggregate if aggregate is not None else throughput(log.rated()) if log.steps else None
        last = log.epochs[-1] if log.epochs else {}
        loss = last.get("test_loss")
        out.update(seq_len=seq_len, tokens_per_second=None if rate is None else rate * seq_len,
                   test_loss=loss,
                   perplexity=math.exp(loss) if isinstance(loss, (int, float)) and loss < 700 else None)
    return out


def _knobs_summary(params: dict[str, Any], outcome: adapters.TrainOutcome,
                   log_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """The training knobs as the run applied them (docs/HARNESS.md "Training knobs"):
    ``stopped_early``, ``first_layer_backward`` and ``input_gradient_steps``, and what fed
    the steps (``input_pipeline``, the adapter's description); ``gradient_bytes``: the bytes
    of one step's gradients (the model record's parameters x the adapter's gradient element
    size, docs/MODEL.md)."""
    pipeline = outcome.input_pipeline or {"kind": setting(params, "input_pipeline")}
    parameters = (log_model or {}).get("parameters")
    gradient = ({"gradient_bytes": int(parameters) * outcome.gradient_element_bytes}
                if isinstance(parameters, int) and not isinstance(parameters, bool) else {})
    return {**gradient, "stopped_early": outcome.stopped_early,
            "first_layer_backward": setting(params, "first_layer_backward"),
            "input_gradient_steps": outcome.input_gradient_steps,
            "input_pipeline": pipeline}


def _workers_summary(ctx: distributed.Context, params: dict[str, Any], log: EventLog, probe_fields: dict[str, Any],
                     outcome: adapters.TrainOutcome, out_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A worker of a multi-worker cell: its report (rank r > 0 writes ``worker.json``; rank 0
    gathers them all) and, for rank 0, the summary fields of the whole cell.  A single
    process: only the gradient-exchange measurement, when there is one (an MXNet dist kvstore)."""
    exchange = {"exchange": outcome.exchange} if outcome.exchange else {}
    if not ctx.distributed:
        return exchange, []
    in_force = probe_fields.get("in_force", {})
    report = {"rank": ctx.rank, "local_rank": ctx.local_rank, "node_rank": ctx.node_rank,
              **distributed.step_stats(ctx, log.unsampled(), params["warmup_steps"]),
              "affinity": in_force.get("affinity"), "threads": in_force.get("threads"),
              "interop_threads": in_force.get("interop_threads"),
              "mismatches": probe_fields.get("mismatches", []), "exchange": outcome.exchange}
    if not ctx.chief:
        distributed.write_report(out_dir, report)
        return {**exchange, "rank": ctx.rank}, []
    reports, notes = distributed.gather_reports(ctx, report)
    extra = distributed.summary_fields(ctx, params, reports, throughput(log.rated()))
    return {**exchange, **extra}, notes
