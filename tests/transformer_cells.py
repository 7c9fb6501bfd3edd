"""What the transformer test files share: a language-model cell's spec, one run of the in-cell
harness on it (as the host launches it), and a script run in a framework's environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from matrun.runner.harness import models

# gpt-tiny on synthetic text, 64-token sequences, 2 threads (every key a spec.json carries)
BASE = {
    "variant": "cpu", "device": "cpu", "gpus": None, "mode": "train",
    "model": "gpt-tiny", "dataset": "synthetic-text", "synthetic_shape": None, "synthetic_classes": None,
    "synthetic_train": 256, "synthetic_test": 32, "synthetic_vocab": 256, "seq_len": 64,
    "train_limit": 0, "test_limit": 0, "epochs": 1, "iterations": 0, "batch_size": 16, "eval_batch_size": 64,
    "optimizer": "adam", "lr": 0.003, "momentum": None, "weight_decay": 0.0, "warmup_steps": 2,
    "threads": 2, "interop_threads": "unset", "cpuset": "", "onednn": True, "layout": None,
    "precision": "fp32", "conv_algo": "heuristic", "layer_profile": False, "preset": "none",
    "onednn_check": False, "seed": 0, "phase_sampling": 0,
}


def run_cell(framework: str, python: Path, stage: Path, run_dir: Path, data_dir: Path | str = "/nonexistent",
             *, env: dict[str, str], **params: Any) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """The harness on a spec of ``BASE`` with ``params``: (the process, its events)."""
    run_dir.mkdir(parents=True)
    spec = {"schema_version": 1, "sweep": "test", "cell_id": "0123456789abcdef", "repeat": 0, "attempt": 1,
            "env_id": f"{framework}-cpu-test", "data_dir": str(data_dir),
            "params": {**BASE, "framework": framework, **params}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update(PYTHONPATH=str(stage), **env)
    proc = subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(run_dir / "spec.json"),
                           "--out", str(run_dir)], capture_output=True, text=True, env=full, cwd=run_dir, timeout=600)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()] \
        if (run_dir / "events.jsonl").exists() else []
    return proc, events


def one(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == kind]
    assert len(found) == 1, kind
    return found[0]


def in_env(python: Path, stage: Path, code: str, env: dict[str, str]) -> Any:
    """Run ``code`` in a framework's environment; its last stdout line, parsed as JSON."""
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(stage), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_layer_profile(events: list[dict[str, Any]], model: str, **walk: Any) -> None:
    """A transformer's layer records are its units in ``models.transformer_walk`` order (the
    walk's name, its group as the kind, its FLOPs), their parameters sum to the model's, and
    each was timed forward and backward (``walk``: the walk's seq_len, or shape and classes)."""
    layers = [e for e in events if e["type"] == "layer"]
    walked = list(models.transformer_walk(model, **walk))
    assert [(e["name"], e["kind"], e["flops"]) for e in layers] == [(u["name"], u["group"], u["flops"])
                                                                    for u in walked]
    count = {k: v for k, v in walk.items() if k in ("shape", "classes")}
    assert sum(e["params"] for e in layers) == models.transformer_param_count(model, **count)
    assert all(e["forward_seconds"] > 0 and e["backward_seconds"] > 0 for e in layers)
