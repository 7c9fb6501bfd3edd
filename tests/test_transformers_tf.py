"""The transformers in TensorFlow / Keras 3, run in the real TensorFlow environment: the zoo's
parameter counts, explicit attention (TensorFlow has no fused kernel: refused), training that
lowers the loss in graph, eager and XLA-compiled modes, and what the summary records."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from matrun.runner.harness import models
from transformer_cells import assert_layer_profile, in_env, one, run_cell

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tf_python() -> Path:
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("tensorflow", "cpu").python


def run(python: Path, stage: Path, run_dir: Path, data_dir: Path | str = "/nonexistent", **params: Any):
    return run_cell("tensorflow", python, stage, run_dir, data_dir, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, **params)


def in_tf(python: Path, stage: Path, code: str) -> Any:
    return in_env(python, stage, code, {"TF_CPP_MIN_LOG_LEVEL": "2"})


def test_every_transformer_has_the_zoo_parameter_count(tf_python, stage):
    found = in_tf(tf_python, stage, """
import json
import tensorflow as tf
from matrun.runner.harness.adapters import _tf_transformers as tt, tensorflow as adapter
adapter.tf = tf
cases = [("gpt-tiny", (128,), 256), ("vit-tiny", (1, 28, 28), 10), ("vit-tiny", (3, 32, 32), 10),
         ("gpt2-small", (1024,), 50257), ("vit-b16", (3, 224, 224), 1000)]
print(json.dumps([adapter.trainable_parameters(tt.build(n, s, c, None)) for n, s, c in cases]))
""")
    assert found == [models.transformer_param_count("gpt-tiny"),
                     models.transformer_param_count("vit-tiny", shape=(1, 28, 28), classes=10),
                     models.transformer_param_count("vit-tiny", shape=(3, 32, 32), classes=10),
                     124_439_808, 86_567_656]


def test_the_causal_mask_hides_the_future(tf_python, stage):
    found = in_tf(tf_python, stage, """
import json
import tensorflow as tf
from matrun.runner.harness.adapters import _tf_transformers as tt
m = tt.build("gpt-tiny", (16,), 256, None)
x = tf.random.uniform((1, 16), 0, 256, tf.int32)
z = tf.concat([x[:, :10], (x[:, 10:] + 1) % 256], axis=1)
print(json.dumps(float(tf.reduce_max(tf.abs(m(x)[:, :10] - m(z)[:, :10])))))
""")
    assert found == 0.0


@pytest.mark.parametrize("mode, in_force", [("default", "graph"), ("eager", "eager"), ("compiled", "compiled")])
def test_a_gpt_cell_trains_in_each_compile_mode(tf_python, stage, tmp_path, mode, in_force):
    proc, events = run(tf_python, stage, tmp_path / "run", epochs=2 if mode == "default" else None,
                       iterations=0 if mode == "default" else 8, compile=mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("gpt-tiny")
    probe = one(events, "probe")["in_force"]
    assert probe["attention"] == "explicit" and probe["compile"] == in_force
    summary = one(events, "summary")
    assert math.isclose(summary["tokens_per_second"], summary["throughput"] * 64, rel_tol=1e-9)
    epochs = [e for e in events if e["type"] == "epoch"]
    assert 0 <= epochs[-1]["test_accuracy"] <= 1
    if mode == "default":
        assert epochs[-1]["test_loss"] < math.log(256) - 1.0
        assert "compilation" not in summary
    if mode == "compiled":
        assert summary["compilation"]["seconds"] > 0 and "XLA" in summary["compilation"]["implementation"]


def test_a_vit_cell_trains_on_images(tf_python, stage, tmp_path):
    proc, events = run(tf_python, stage, tmp_path / "vit", model="vit-tiny", dataset="synthetic",
                       synthetic_shape=[1, 28, 28], synthetic_classes=10, synthetic_vocab=None, seq_len=None,
                       synthetic_train=128)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("vit-tiny", shape=(1, 28, 28),
                                                                               classes=10)


def test_the_units_chained_are_the_network(tf_python, stage):
    """The layer profile's units over the network's own layers: chained, the network's logits;
    their backward passes on the upstream gradients, the network's gradients."""
    found = in_tf(tf_python, stage, """
import json
import keras, tensorflow as tf
from matrun.runner.harness.adapters import _tf_transformers as tt, tensorflow as adapter
adapter.tf = tf
keras.utils.set_random_seed(0)
out = {}
for name, shape, x, y in (("gpt-tiny", (32,), tf.random.uniform((4, 32), 0, 256, tf.int32),
                           tf.random.uniform((4, 32), 0, 256, tf.int64)),
                          ("vit-tiny", (1, 28, 28), tf.random.normal((4, 1, 28, 28)),
                           tf.random.uniform((4,), 0, 10, tf.int64))):
    net = tt.build(name, shape, 10, None)
    xent = lambda logits: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    with tf.GradientTape() as tape:
        logits = net(x)
        loss = xent(logits)
    full = dict(zip((v.path for v in net.trainable_variables), tape.gradient(loss, net.trainable_variables)))
    units = tt.units(net)
    with tf.GradientTape() as tape:
        ins, outs = tt.unit_inputs(units, x)
        loss = xent(outs[-1])
    up = tape.gradient(loss, outs)
    summed = {}
    for i, u in enumerate(units):
        with tf.GradientTape() as tape:
            o = u(ins[i])
        for v, g in zip(u.trainable_variables, tape.gradient(o, u.trainable_variables, output_gradients=up[i])):
            summed[v.path] = summed.get(v.path, 0) + tf.convert_to_tensor(g)
    grad = max(float(tf.reduce_max(tf.abs(summed[k] - tf.convert_to_tensor(full[k])))) for k in full if k in summed)
    out[name] = [[u.name for u in units], float(tf.reduce_max(tf.abs(logits - outs[-1]))), grad,
                 sorted(summed) == sorted(full)]
print(json.dumps(out))
""")
    for name, shape in (("gpt-tiny", {"seq_len": 32}), ("vit-tiny", {"shape": (1, 28, 28), "classes": 10})):
        names, diff, grad, covered = found[name]
        assert names == [u["name"] for u in models.transformer_walk(name, **shape)]
        assert covered and diff < 1e-5 and grad < 1e-5, (name, diff, grad)


def test_a_layer_profile_times_every_unit_under_its_group(tf_python, stage, tmp_path):
    """layer_profile on a transformer: one layer record per unit of models.transformer_walk
    (forward a tf.function on its real input, backward the tape's gradient given the real
    upstream gradient), its group as the kind, the parameters summing to the model's; a ViT's
    units too."""
    proc, events = run(tf_python, stage, tmp_path / "gpt", seq_len=32, iterations=3, epochs=None,
                       layer_profile=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_layer_profile(events, "gpt-tiny", seq_len=32)

    proc, events = run(tf_python, stage, tmp_path / "vit", model="vit-tiny", dataset="synthetic",
                       synthetic_shape=[1, 28, 28], synthetic_classes=10, synthetic_vocab=None, seq_len=None,
                       synthetic_train=64, iterations=2, epochs=None, layer_profile=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_layer_profile(events, "vit-tiny", shape=(1, 28, 28), classes=10)


def test_fused_attention_is_refused_with_the_reason(tf_python, stage, tmp_path):
    proc, _ = run(tf_python, stage, tmp_path / "run", attention="fused")
    assert proc.returncode == 2 and "no fused scaled-dot-product kernel" in proc.stderr
    assert "Traceback" not in proc.stderr
