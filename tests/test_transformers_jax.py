"""The transformers in JAX / Flax, run in the real JAX environment: the zoo's parameter counts,
explicit and fused attention computing the same function, training that lowers the loss, the
compilation recorded apart, and what JAX refuses."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from matrun.runner.harness import models
from transformer_cells import assert_layer_profile, in_env, one, run_cell

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jax_python() -> Path:
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("jax", "cpu").python


def run(python: Path, stage: Path, run_dir: Path, data_dir: Path | str = "/nonexistent", **params: Any):
    return run_cell("jax", python, stage, run_dir, data_dir, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, **params)


CONFIG = ('dict(threads=2, interop_threads="unset", onednn=True, device="cpu", conv_algo="heuristic", seed=0, '
          'layout=None, precision="fp32", optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=0.0, gpus=None, '
          'cpuset="")')


def in_jax(python: Path, stage: Path, code: str) -> Any:
    return in_env(python, stage, code.replace("CONFIG", CONFIG),
                  {"TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"})


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
    assert summary["compilation"]["compiles"] >= 1 and summary["compilation"]["in_steps"] == 0


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


def test_the_units_chained_are_the_network(jax_python, stage):
    """The layer profile's units on the network's own parameter subtrees: chained, the
    network's logits; their VJPs on the upstream gradients, the network's gradients."""
    found = in_jax(jax_python, stage, """
from matrun.runner.harness.adapters import _jax_transformers as jt, jax as adapter
adapter.configure(CONFIG)
import json, jax, jax.numpy as jnp, optax
out = {}
for name, shape, x, y in (
        ("gpt-tiny", (32,), jax.random.randint(jax.random.PRNGKey(1), (4, 32), 0, 256),
         jax.random.randint(jax.random.PRNGKey(2), (4, 32), 0, 256)),
        ("vit-tiny", (1, 28, 28), jax.random.normal(jax.random.PRNGKey(1), (4, 1, 28, 28)),
         jax.random.randint(jax.random.PRNGKey(2), (4,), 0, 10))):
    net = jt.TransformerNetwork(name, shape, 10, fused=False)
    p = net.init(jax.random.PRNGKey(0))["params"]
    xent = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    full = jax.jit(jax.grad(lambda q: xent(net.apply({"params": q}, x, train=False))))(p)
    units = net.transformer_units(p)
    subs = [u.params for u in units]
    ins, outs = jax.jit(lambda s: jt.unit_inputs(units, s, x))(subs)
    up = jax.jit(jax.grad(lambda d: xent(jt.unit_inputs(units, subs, x, d)[1][-1])))([jnp.zeros_like(o) for o in outs])
    # a unit's subtree holds the network's own arrays: sum the units' gradients per array
    summed = {}
    for i, u in enumerate(units):
        g = jax.vjp(lambda q: u.apply(q, ins[i]), u.params)[1](up[i])[0]
        for leaf, grad in zip(jax.tree_util.tree_leaves(u.params), jax.tree_util.tree_leaves(g)):
            summed[id(leaf)] = summed.get(id(leaf), 0) + grad
    leaves = jax.tree_util.tree_leaves(p)
    covered = sorted(summed) == sorted(id(a) for a in leaves)
    grad = max(float(jnp.max(jnp.abs(summed.get(id(a), jnp.inf) - b)))
               for a, b in zip(leaves, jax.tree_util.tree_leaves(full)))
    diff = float(jnp.max(jnp.abs(net.apply({"params": p}, x, train=False) - outs[-1])))
    out[name] = [[u.name for u in units], diff, grad, covered]
print(json.dumps(out))
""")
    for name, shape in (("gpt-tiny", {"seq_len": 32}), ("vit-tiny", {"shape": (1, 28, 28), "classes": 10})):
        names, diff, grad, covered = found[name]
        assert names == [u["name"] for u in models.transformer_walk(name, **shape)]
        assert covered and diff < 1e-5 and grad < 1e-5, (name, diff, grad)


def test_a_layer_profile_times_every_unit_under_its_group(jax_python, stage, tmp_path):
    """layer_profile on a transformer: one layer record per unit of models.transformer_walk
    (each compiled alone, backward its VJP on the real gradient), its group as the kind, the
    parameters summing to the model's; a ViT's units too."""
    proc, events = run(jax_python, stage, tmp_path / "gpt", seq_len=32, iterations=3, epochs=None,
                       layer_profile=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_layer_profile(events, "gpt-tiny", seq_len=32)
    assert any("each unit was compiled and timed as its own XLA program" in n for n in one(events, "summary")["notes"])

    proc, events = run(jax_python, stage, tmp_path / "vit", model="vit-tiny", dataset="synthetic",
                       synthetic_shape=[1, 28, 28], synthetic_classes=10, synthetic_vocab=None, seq_len=None,
                       synthetic_train=64, iterations=2, epochs=None, layer_profile=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_layer_profile(events, "vit-tiny", shape=(1, 28, 28), classes=10)


def test_eager_is_refused_with_the_reason(jax_python, stage, tmp_path):
    proc, _ = run(jax_python, stage, tmp_path / "run", compile="eager")
    assert proc.returncode == 2 and "no eager mode" in proc.stderr and "Traceback" not in proc.stderr
