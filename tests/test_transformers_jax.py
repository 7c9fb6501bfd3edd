"""The transformers in JAX / Flax, run in the real JAX environment: the zoo's parameter counts,
explicit and fused attention computing the same function, training that lowers the loss, the
compilation recorded apart, and what JAX refuses."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from matrun.runner.harness import models

pytestmark = pytest.mark.slow

BASE = {
    "framework": "jax", "variant": "cpu", "device": "cpu", "gpus": None, "mode": "train",
    "model": "gpt-tiny", "dataset": "synthetic-text", "synthetic_shape": None, "synthetic_classes": None,
    "synthetic_train": 256, "synthetic_test": 32, "synthetic_vocab": 256, "seq_len": 64,
    "train_limit": 0, "test_limit": 0, "epochs": 1, "iterations": 0, "batch_size": 16, "eval_batch_size": 64,
    "optimizer": "adam", "lr": 0.003, "momentum": None, "weight_decay": 0.0, "warmup_steps": 2,
    "threads": 2, "interop_threads": "unset", "cpuset": "", "onednn": True, "layout": None,
    "precision": "fp32", "conv_algo": "heuristic", "layer_profile": False, "preset": "none",
    "onednn_check": False, "seed": 0, "phase_sampling": 0,
}


@pytest.fixture(scope="module")
def jax_python() -> Path:
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("jax", "cpu").python


def run(python: Path, stage: Path, run_dir: Path, data_dir: Path | str = "/nonexistent", **params: Any):
    run_dir.mkdir(parents=True)
    spec = {"schema_version": 1, "sweep": "test", "cell_id": "0123456789abcdef", "repeat": 0, "attempt": 1,
            "env_id": "jax-cpu-test", "data_dir": str(data_dir), "params": {**BASE, **params}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(stage), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(run_dir / "spec.json"),
                           "--out", str(run_dir)], capture_output=True, text=True, env=env, cwd=run_dir, timeout=600)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()] \
        if (run_dir / "events.jsonl").exists() else []
    return proc, events


def one(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == kind]
    assert len(found) == 1, kind
    return found[0]


CONFIG = ('dict(threads=2, interop_threads="unset", onednn=True, device="cpu", conv_algo="heuristic", seed=0, '
          'layout=None, precision="fp32", optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=0.0, gpus=None, '
          'cpuset="")')


def in_jax(python: Path, stage: Path, code: str) -> Any:
    code = code.replace("CONFIG", CONFIG)
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(stage), "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_transformer_has_the_zoo_parameter_count(jax_python, stage):
    found = in_jax(jax_python, stage, """
import json, jax
from matrun.runner.harness.adapters import _jax_transformers as jt, jax as adapter
adapter.configure(CONFIG)
parameter_count = adapter.parameter_count
cases = [("gpt-tiny", (128,), 256), ("gpt2-small", (1024,), 50257), ("vit-tiny", (1, 28, 28), 10),
         ("vit-tiny", (3, 32, 32), 10), ("vit-b16", (3, 224, 224), 1000)]
out = []
for n, s, c in cases:
    net = jt.TransformerNetwork(n, s, c, fused=False)
    shapes = jax.eval_shape(lambda: net.module.init(jax.random.PRNGKey(0), jax.numpy.zeros(net.input_shape(1), net.input_dtype)))
    out.append(parameter_count(shapes["params"]))
print(json.dumps(out))
""")
    assert found == [models.transformer_param_count("gpt-tiny"), 124_439_808,
                     models.transformer_param_count("vit-tiny", shape=(1, 28, 28), classes=10),
                     models.transformer_param_count("vit-tiny", shape=(3, 32, 32), classes=10), 86_567_656]


def test_explicit_and_fused_attention_compute_the_same_function(jax_python, stage):
    found = in_jax(jax_python, stage, """
from matrun.runner.harness.adapters import _jax_transformers as jt, jax as adapter
adapter.configure(CONFIG)
import json, jax, jax.numpy as jnp
out = {}
for name, shape, x in (("gpt-tiny", (32,), jax.random.randint(jax.random.PRNGKey(1), (4, 32), 0, 256)),
                       ("vit-tiny", (1, 28, 28), jax.random.normal(jax.random.PRNGKey(1), (4, 1, 28, 28)))):
    a = jt.TransformerNetwork(name, shape, 10, fused=False)
    b = jt.TransformerNetwork(name, shape, 10, fused=True)
    v = a.init(jax.random.PRNGKey(0))
    # one jitted program per network (op by op, every operation would be compiled alone)
    both = lambda net: jax.jit(lambda p: (net.apply({"params": p}, x, train=False), jax.grad(
        lambda q: jnp.mean(jnp.square(net.apply({"params": q}, x, train=False))))(p)))
    (ya, ga), (yb, gb) = both(a)(v["params"]), both(b)(v["params"])
    grad = max(float(jnp.max(jnp.abs(p - q))) for p, q in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)))
    out[name] = [float(jnp.max(jnp.abs(ya - yb))), float(jnp.max(jnp.abs(ya))), grad, list(ya.shape)]
print(json.dumps(out))
""")
    for name, (diff, scale, grad, shape) in found.items():
        assert diff <= 1e-5 * max(1.0, scale) and grad < 1e-5, (name, diff, grad)
    assert found["gpt-tiny"][3] == [4, 32, 256]  # (batch, T, vocab)
    assert found["vit-tiny"][3] == [4, 10]


def test_a_gpt_cell_trains_on_synthetic_text_with_its_compilation_apart(jax_python, stage, tmp_path):
    proc, events = run(jax_python, stage, tmp_path / "run", epochs=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("gpt-tiny")
    probe = one(events, "probe")["in_force"]
    assert probe["attention"] == "explicit" and probe["compile"] == "compiled"
    epochs = [e for e in events if e["type"] == "epoch"]
    assert epochs[-1]["test_loss"] < math.log(256) - 1.0
    assert 0 <= epochs[-1]["test_accuracy"] <= 1
    summary = one(events, "summary")
    assert math.isclose(summary["tokens_per_second"], summary["throughput"] * 64, rel_tol=1e-9)
    assert summary["compilation"]["seconds"] > 0 and summary["compilation"]["batch_sizes"] == [16]
    steps = [e["seconds"] for e in events if e["type"] == "step"]
    assert max(steps) < summary["compilation"]["seconds"]


def test_fused_attention_and_a_vit_cell(jax_python, stage, tmp_path):
    proc, events = run(jax_python, stage, tmp_path / "gpt", attention="fused", iterations=4, epochs=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_force = one(events, "probe")["in_force"]
    assert in_force["attention"] == "fused" and in_force["attention_kernel"] == "xla"
    proc, events = run(jax_python, stage, tmp_path / "vit", model="vit-tiny", dataset="synthetic",
                       synthetic_shape=[1, 28, 28], synthetic_classes=10, synthetic_vocab=None, seq_len=None,
                       synthetic_train=128)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("vit-tiny", shape=(1, 28, 28),
                                                                               classes=10)


def test_eager_is_refused_with_the_reason(jax_python, stage, tmp_path):
    proc, _ = run(jax_python, stage, tmp_path / "run", compile="eager")
    assert proc.returncode == 2 and "no eager mode" in proc.stderr and "Traceback" not in proc.stderr
