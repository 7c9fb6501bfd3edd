"""Fabricate result bundles with known values, in the exact on-disk format (docs/BUNDLE.md).

Tests of ingest, views and the report build warehouses from these, so every expected
number in those tests is written by hand from the arguments given here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from matrun.warehouse.bundles.layout import (
    EVENTS,
    MONITOR,
    SCHEMA_VERSION,
    SPEC,
    STDERR,
    STDOUT,
    RunKey,
)
from matrun.warehouse.bundles.write import write_json_atomic, write_jsonl

DEFAULT_PARAMS: dict[str, Any] = {
    "framework": "torch", "variant": "cpu", "device": "cpu", "mode": "train",
    "model": "lenet5", "dataset": "fashion-mnist",
    "synthetic_shape": [1, 28, 28], "synthetic_classes": 10,
    "synthetic_train": 2048, "synthetic_test": 512,
    "train_limit": 0, "test_limit": 0,
    "epochs": 2, "iterations": 0,
    "batch_size": 64, "eval_batch_size": 1000,
    "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0,
    "warmup_steps": 2, "threads": 1, "interop_threads": "unset",
    "cpuset": "", "onednn": True, "seed": 0,
    "gpus": None, "layout": "nchw", "precision": "fp32", "conv_algo": "heuristic",
    "layer_profile": False, "preset": "none", "onednn_check": True,
}


def make_bundle(
    results: Path,
    *,
    sweep: str = "fixture",
    cell_id: str = "c0ffee0000000001",
    repeat: int = 0,
    attempt: int = 1,
    params: dict[str, Any] | None = None,
    status: str = "ok",
    exit_code: int = 0,
    step_seconds: Sequence[float] = (0.02, 0.02, 0.01, 0.01, 0.01, 0.01),
    images_per_step: int = 64,
    warmup_steps: int = 2,
    epochs: Sequence[dict[str, Any]] = (
        {"train_loss": 1.0, "train_accuracy": 0.6, "test_loss": 0.8, "test_accuracy": 0.7,
         "epoch_seconds": 10.0, "test_seconds": 1.0},
        {"train_loss": 0.5, "train_accuracy": 0.8, "test_loss": 0.6, "test_accuracy": 0.8,
         "epoch_seconds": 10.0, "test_seconds": 1.0},
    ),
    throughput: float | None = None,
    monitor: Sequence[tuple[float, float, float, float, int]] = (
        (0.2, 90.0, 10.0, 0.0, 100_000_000),
        (0.4, 110.0, 10.0, 0.0, 300_000_000),
    ),
    mismatches: Sequence[str] = (),
    layers: Sequence[dict[str, Any]] = (),
    hostname: str = "fixture-host",
    with_result: bool = True,
    error_tail: str = "",
    wall_seconds: float = 30.0,
    summary_extra: dict[str, Any] | None = None,
) -> Path:
    """Write one complete bundle and return its directory.

    ``monitor`` rows are (t, cpu_user, cpu_system, iowait, rss_bytes).  ``layers`` are
    layer records (name, kind, forward_seconds, backward_seconds, …) in network order.  ``throughput``
    defaults to the median over the timed steps of images/seconds, as the harness computes.
    ``summary_extra``: more fields of the summary record (a language model's, compilation).
    The summary's train time is the sum of the epochs' ``epoch_seconds``; its accuracy the
    last epoch's ``test_accuracy``.
    """
    key = RunKey(sweep, cell_id, repeat, attempt)
    run_dir = key.directory(results)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {**DEFAULT_PARAMS, **(params or {})}
    # a release (``version``) has an environment of its own, as the executors give it
    release = f"-{resolved['version']}" if resolved.get("version") else ""
    env_id = f"{resolved['framework']}-{resolved['variant']}{release}-0123456789ab"
    write_json_atomic(run_dir / SPEC, {
        "schema_version": SCHEMA_VERSION, "sweep": sweep, "cell_id": cell_id,
        "repeat": repeat, "attempt": attempt, "env_id": env_id,
        "data_dir": "/usr/share/datasets", "params": resolved,
    })

    timed = sorted(images_per_step / s for s in step_seconds[warmup_steps:])
    if throughput is None and timed:
        mid = len(timed) // 2
        throughput = timed[mid] if len(timed) % 2 else (timed[mid - 1] + timed[mid]) / 2
    records: list[dict[str, Any]] = [
        {"type": "probe", "framework": resolved["framework"], "framework_version": "2.13.0+cpu",
         "python": "3.11.7", "build": "fixture build",
         "in_force": {"threads": resolved["threads"], "interop_threads": 1, "affinity": [0, 1],
                      "onednn": resolved["onednn"], "device": "cpu"},
         "libraries": [{"name": "libgomp", "path": "/lib/libgomp.so.1"}],
         "mismatches": list(mismatches)},
        {"type": "data", "dataset": resolved["dataset"], "train_size": 60000, "test_size": 10000,
         "shape": [1, 28, 28], "classes": 10, "load_seconds": 0.5},
        {"type": "model", "name": resolved["model"], "parameters": 61706},
    ]
    for i, seconds in enumerate(step_seconds):
        records.append({"type": "step", "epoch": 0, "step": i,
                        "phase": "warmup" if i < warmup_steps else "timed",
                        "seconds": seconds, "images": images_per_step})
    for e, values in enumerate(epochs):
        records.append({"type": "epoch", "epoch": e, "steps": len(step_seconds), **values})
    for i, layer in enumerate(layers):
        records.append({"type": "layer", "index": i, "repeats": 20, "params": 0, "flops": 0, **layer})
    if status == "ok":
        records.append({
            "type": "summary",
            "train_seconds": sum(v["epoch_seconds"] for v in epochs),
            "test_seconds": epochs[-1]["test_seconds"] if epochs else 0.0,
            "accuracy": epochs[-1]["test_accuracy"] if epochs else None,
            "throughput": throughput,
            "time_to_first_step": 0.75,
            "timed_steps": max(0, len(step_seconds) - warmup_steps),
            "warmup_steps": min(warmup_steps, len(step_seconds)),
            "diverged": False,
            **(summary_extra or {}),
        })
        records.append({"type": "end", "t": 1_790_000_100.0})
    write_jsonl(run_dir / EVENTS, {"harness_version": "1", "t": 1_790_000_000.0}, records)
    write_jsonl(run_dir / MONITOR, {"interval_s": 0.2, "pid": 4242}, [
        {"t": t, "cpu_user": u, "cpu_system": s, "iowait": w, "rss_bytes": r, "nprocs": 1}
        for (t, u, s, w, r) in monitor
    ])
    (run_dir / STDOUT).write_text("", encoding="utf-8")
    (run_dir / STDERR).write_text(error_tail, encoding="utf-8")
    if not with_result:
        return run_dir

    n = len(monitor)
    user = sum(m[1] for m in monitor) / n if n else None
    system = sum(m[2] for m in monitor) / n if n else None
    write_json_atomic(run_dir / "result.json", {
        "schema_version": SCHEMA_VERSION, "sweep": sweep, "cell_id": cell_id,
        "repeat": repeat, "attempt": attempt, "env_id": env_id, "executor": "local",
        "status": status, "exit_code": exit_code, "error_tail": error_tail,
        "started_at": "2026-11-22T01:50:00+00:00", "ended_at": "2026-11-22T01:50:30+00:00",
        "wall_seconds": wall_seconds,
        "host": {"hostname": hostname, "cpu_model": "Fixture CPU", "cpu_count": 2,
                 "mem_total_bytes": 24 * 2**30, "os": "Linux fixture", "python": "3.11.7",
                 "matrun_version": "0.1.0"},
        "monitor": {
            "interval_s": 0.2, "samples": n,
            "cpu_user_avg": user, "cpu_system_avg": system,
            "cpu_total_avg": (user + system) if n else None,
            "iowait_avg": sum(m[3] for m in monitor) / n if n else None,
            "rss_avg_bytes": sum(m[4] for m in monitor) / n if n else None,
            "rss_peak_bytes": max(m[4] for m in monitor) if n else None,
        },
    })
    return run_dir


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def patch_events(run_dir: Path, record_type: str, **changes: Any) -> None:
    """Change the fields of every `record_type` record of a bundle's events.jsonl."""
    path = run_dir / "events.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for record in lines:
        if record.get("type") == record_type:
            record.update(changes)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
