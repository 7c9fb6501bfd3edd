"""The transformers in MXNet 1.9.1 Gluon, run in the real MXNet environment: the zoo's parameter
counts, the causal mask, training that lowers the loss hybridized (compiled) and imperative
(eager), the compilation timed apart, and what is refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from matrun.runner.harness import models
from transformer_cells import in_env, one, run_cell

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mx_python() -> Path:
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("mxnet", "cpu").python


def run(python: Path, stage: Path, run_dir: Path, data_dir: Path | str = "/nonexistent", **params: Any):
    return run_cell("mxnet", python, stage, run_dir, data_dir, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, **params)


def in_mx(python: Path, stage: Path, code: str) -> Any:
    return in_env(python, stage, code, {"OMP_NUM_THREADS": "2"})


def test_every_transformer_has_the_zoo_parameter_count(mx_python, stage):
    found = in_mx(mx_python, stage, """
import json
import mxnet as mx, numpy as np
from matrun.runner.harness.adapters import _mxnet_transformers as mt, mxnet as adapter
adapter.mx, adapter.np = mx, np
cases = [("gpt-tiny", (128,), 256), ("vit-tiny", (1, 28, 28), 10), ("vit-tiny", (3, 32, 32), 10),
         ("gpt2-small", (1024,), 50257), ("vit-b16", (3, 224, 224), 1000)]
out = []
for n, s, c in cases:
    net = mt.build(n, s, c)
    out.append(adapter.parameter_count(net))
print(json.dumps(out))
""")
    assert found == [models.transformer_param_count("gpt-tiny"),
                     models.transformer_param_count("vit-tiny", shape=(1, 28, 28), classes=10),
                     models.transformer_param_count("vit-tiny", shape=(3, 32, 32), classes=10),
                     124_439_808, 86_567_656]


def test_the_causal_mask_hides_the_future_hybridized_or_not(mx_python, stage):
    found = in_mx(mx_python, stage, """
import json
import mxnet as mx
from matrun.runner.harness.adapters import _mxnet_transformers as mt
out = []
for hybrid in (False, True):
    m = mt.build("gpt-tiny", (16,), 256)
    m.initialize()
    if hybrid:
        m.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.randint(0, 256, (1, 16)).astype("float32")
    z = mx.nd.concat(x[:, :10], (x[:, 10:] + 1) % 256, dim=1)
    out.append(float((m(x)[:, :10] - m(z)[:, :10]).abs().max().asscalar()))
    out.append(list(m(x).shape))
print(json.dumps(out))
""")
    assert found == [0.0, [1, 16, 256], 0.0, [1, 16, 256]]


@pytest.mark.parametrize("mode, in_force", [("default", "compiled"), ("eager", "eager"), ("compiled", "compiled")])
def test_a_gpt_cell_trains_in_each_compile_mode(mx_python, stage, tmp_path, mode, in_force):
    proc, events = run(mx_python, stage, tmp_path / "run", epochs=2 if mode == "default" else None,
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
        record = summary["compilation"]
        assert record["seconds"] > 0 and record["batch_sizes"] == [16]
        assert record["compiles"] == 1 and record["in_steps"] == 0  # Gluon built the graph in the warm-up


def test_a_vit_cell_trains_on_images(mx_python, stage, tmp_path):
    proc, events = run(mx_python, stage, tmp_path / "vit", model="vit-tiny", dataset="synthetic",
                       synthetic_shape=[1, 28, 28], synthetic_classes=10, synthetic_vocab=None, seq_len=None,
                       synthetic_train=128)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("vit-tiny", shape=(1, 28, 28),
                                                                               classes=10)


def test_fused_attention_is_refused_with_the_reason(mx_python, stage, tmp_path):
    proc, _ = run(mx_python, stage, tmp_path / "run", attention="fused")
    assert proc.returncode == 2 and "compute attention explicitly" in proc.stderr
    assert "Traceback" not in proc.stderr
