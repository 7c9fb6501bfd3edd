"""The transformers in PyTorch, run in the real torch environment: the zoo's parameter counts,
explicit and fused attention computing the same function, training that lowers the validation
loss, compilation timed apart from the steps, and the summary's language-model fields."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from matrun.runner.harness import models
from transformer_cells import assert_layer_profile, in_env, one, run_cell

pytestmark = pytest.mark.slow


def run(python: Path, stage: Path, run_dir: Path, data_dir: Path | str = "/nonexistent", **params: Any):
    return run_cell("torch", python, stage, run_dir, data_dir, env={"OMP_NUM_THREADS": "2"}, **params)


def in_torch(python: Path, stage: Path, code: str) -> Any:
    return in_env(python, stage, code, {"OMP_NUM_THREADS": "2"})


def test_every_transformer_has_the_zoo_parameter_count(torch_python, stage):
    found = in_torch(torch_python, stage, """
import json
from matrun.runner.harness.adapters import _torch_transformers as tt
from matrun.runner.harness.adapters.torch import parameter_count
cases = [("gpt-tiny", (128,), 256), ("gpt2-small", (1024,), 50257), ("vit-tiny", (1, 28, 28), 10),
         ("vit-tiny", (3, 32, 32), 10), ("vit-b16", (3, 224, 224), 1000)]
print(json.dumps([parameter_count(tt.build(n, s, c, fused=True)) for n, s, c in cases]))
""")
    assert found == [models.transformer_param_count("gpt-tiny"), 124_439_808,
                     models.transformer_param_count("vit-tiny", shape=(1, 28, 28), classes=10),
                     models.transformer_param_count("vit-tiny", shape=(3, 32, 32), classes=10), 86_567_656]


def test_explicit_and_fused_attention_compute_the_same_function(torch_python, stage):
    """The same weights, one batch: the logits and the gradients of both agree to float32
    rounding, causal (GPT) and not (ViT)."""
    found = in_torch(torch_python, stage, """
import json, torch
from matrun.runner.harness.adapters import _torch_transformers as tt
out = {}
for name, shape, x in (("gpt-tiny", (32,), torch.randint(0, 256, (4, 32))),
                       ("vit-tiny", (1, 28, 28), torch.randn(4, 1, 28, 28))):
    torch.manual_seed(0); a = tt.build(name, shape, 10, fused=False)
    torch.manual_seed(0); b = tt.build(name, shape, 10, fused=True)
    ya, yb = a(x), b(x)
    ya.square().mean().backward(); yb.square().mean().backward()
    grad = max((p.grad - q.grad).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    out[name] = [(ya - yb).abs().max().item(), ya.abs().max().item(), grad, list(ya.shape)]
print(json.dumps(out))
""")
    for name, (diff, scale, grad, shape) in found.items():
        assert diff <= 1e-5 * max(1.0, scale) and grad < 1e-5, (name, diff, grad)
    assert found["gpt-tiny"][3] == [4, 256, 32]  # (batch, vocab, T)
    assert found["vit-tiny"][3] == [4, 10]


def test_the_causal_mask_hides_the_future(torch_python, stage):
    found = in_torch(torch_python, stage, """
import json, torch
from matrun.runner.harness.adapters import _torch_transformers as tt
res = []
for fused in (False, True):
    torch.manual_seed(0); m = tt.build("gpt-tiny", (16,), 256, fused=fused).eval()
    x = torch.randint(0, 256, (1, 16)); z = x.clone(); z[0, 10:] = (z[0, 10:] + 1) % 256
    res.append((m(x)[..., :10] - m(z)[..., :10]).abs().max().item())
print(json.dumps(res))
""")
    assert found == [0.0, 0.0]


def test_a_gpt_cell_trains_on_synthetic_text_and_reports_tokens_and_perplexity(torch_python, stage, tmp_path):
    proc, events = run(torch_python, stage, tmp_path / "run", epochs=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("gpt-tiny")
    assert one(events, "model")["flops"] == models.transformer_flops("gpt-tiny", seq_len=64)
    data = one(events, "data")
    assert data["shape"] == [64] and data["classes"] == 256 and data["train_size"] == 256
    probe = one(events, "probe")["in_force"]
    assert probe["attention"] == "fused" and probe["compile"] == "eager" and probe["attention_kernel"]
    epochs = [e for e in events if e["type"] == "epoch"]
    assert epochs[-1]["test_loss"] < math.log(256) - 1.0  # well below a uniform guess over 256 tokens
    assert 0 <= epochs[-1]["test_accuracy"] <= 1
    summary = one(events, "summary")
    assert summary["seq_len"] == 64
    assert math.isclose(summary["tokens_per_second"], summary["throughput"] * 64, rel_tol=1e-9)
    assert math.isclose(summary["perplexity"], math.exp(epochs[-1]["test_loss"]), rel_tol=1e-9)
    assert "compilation" not in summary


def test_explicit_attention_is_recorded_in_force(torch_python, stage, tmp_path):
    proc, events = run(torch_python, stage, tmp_path / "run", attention="explicit", iterations=4, epochs=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = one(events, "probe")
    assert probe["in_force"]["attention"] == "explicit" and "attention_kernel" not in probe["in_force"]
    assert probe["mismatches"] == []


def test_a_vit_cell_trains_on_images(torch_python, stage, tmp_path):
    proc, events = run(torch_python, stage, tmp_path / "run", model="vit-tiny", dataset="synthetic",
                       synthetic_shape=[1, 28, 28], synthetic_classes=10, synthetic_vocab=None, seq_len=None,
                       epochs=1, synthetic_train=128)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "model")["parameters"] == models.transformer_param_count("vit-tiny", shape=(1, 28, 28),
                                                                               classes=10)
    summary = one(events, "summary")
    assert "tokens_per_second" not in summary and summary["throughput"] > 0


def test_a_compiled_cell_compiles_before_its_first_step_and_trains_as_eager_does(torch_python, stage, tmp_path):
    """torch.compile's time lands in ``compilation``, not in a step; the compiled model starts
    from the same weights and trains to the same loss as eager, to float rounding.  Inductor's
    on-disk cache is recorded: an empty one makes a cold compile, the same cell again a warm one."""
    eager, e_events = run(torch_python, stage, tmp_path / "eager", iterations=6, epochs=None, compile="eager",
                          attention="explicit")
    cache = {"OMP_NUM_THREADS": "2", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    compiled, c_events = run_cell("torch", torch_python, stage, tmp_path / "compiled", env=cache, iterations=6,
                                  epochs=None, compile="compiled", attention="explicit")
    if compiled.returncode != 0 and "C++ compile" in compiled.stderr:
        pytest.fail("torch.compile needs a C++ compiler in the torch environment: " + compiled.stderr[-500:])
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr[-3000:]
    record = one(c_events, "summary")["compilation"]
    assert record["mode"] == "compiled" and record["seconds"] > 0 and record["batch_sizes"] == [16]
    assert record["compiles"] >= 1 and record["in_steps"] == 0  # no step paid for a compilation
    assert one(c_events, "probe")["in_force"]["compile"] == "compiled"
    loss_e = [e for e in e_events if e["type"] == "epoch"][-1]["train_loss"]
    loss_c = [e for e in c_events if e["type"] == "epoch"][-1]["train_loss"]
    assert math.isclose(loss_e, loss_c, rel_tol=1e-3), (loss_e, loss_c)
    assert record["cache"]["state"] == "cold" and record["cache"]["hits"] == 0 and record["cache"]["misses"] > 0
    again, a_events = run_cell("torch", torch_python, stage, tmp_path / "again", env=cache, iterations=6,
                               epochs=None, compile="compiled", attention="explicit")
    assert again.returncode == 0, again.stderr[-3000:]
    warm = one(a_events, "summary")["compilation"]["cache"]
    assert warm["state"] == "warm" and warm["misses"] == 0 and warm["hits"] > 0


def test_fortunes_train_a_gpt_cell(torch_python, stage, tmp_path):
    root = tmp_path / "data" / "fortunes"
    root.mkdir(parents=True)
    (root / "quotes").write_text("\n%\n".join(f"A fortune, number {i}, for the tests." for i in range(200)))
    proc, events = run(torch_python, stage, tmp_path / "run", tmp_path / "data", dataset="fortunes",
                       synthetic_vocab=None, synthetic_train=None, synthetic_test=None, seq_len=32, iterations=5,
                       epochs=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert one(events, "data")["dataset"] == "fortunes" and one(events, "data")["classes"] == 256


def test_a_sequence_longer_than_the_positions_is_a_bad_spec(torch_python, stage, tmp_path):
    proc, events = run(torch_python, stage, tmp_path / "run", seq_len=129)
    assert proc.returncode == 2, proc.stderr
    assert "[params -> seq_len] gpt-tiny has 128 positions" in proc.stderr and "Traceback" not in proc.stderr


def test_a_layer_profile_times_every_unit_under_its_group(torch_python, stage, tmp_path):
    """layer_profile on a transformer: one layer record per unit of models.transformer_walk,
    its group as the kind, the parameters summing to the model's (how the groups' shares move
    with the sequence is a measurement: studies/transformers.toml's attention-share-grows, not a test)."""
    proc, events = run(torch_python, stage, tmp_path / "run", seq_len=32, iterations=3, epochs=None,
                       layer_profile=True, attention="explicit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_layer_profile(events, "gpt-tiny", seq_len=32)


def test_a_planned_transformer_sweep_runs_through_the_host_and_lands_in_run_overview(torch_env, tmp_path):
    """The whole path a user takes: matrix.toml → plan → local executor → bundle → warehouse
    (the host nulls what a cell does not use: a synthetic-text cell keeps its sequence counts)."""
    import sys

    from lake_client import plain_connect

    (tmp_path / "matrix.toml").write_text("""
[sweep]
name = "lm"
[fixed]
model = "gpt-tiny"
dataset = "synthetic-text"
seq_len = 32
synthetic_train = 96
synthetic_test = 32
iterations = 6
batch_size = 16
warmup_steps = 2
threads = 2
onednn_check = false
[axes]
attention = ["explicit", "fused"]
""")
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}
    proc = subprocess.run([str(Path(sys.executable).with_name("matrun")), "sweep"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 runs (2 ok)" in proc.stdout
    con = plain_connect(tmp_path / "matrun.duckdb")
    try:
        rows = con.execute("SELECT attention, seq_len, tokens_per_second, throughput, perplexity, attention_kernel, "
                           "layout FROM run_overview ORDER BY attention").fetchall()
    finally:
        con.close()
    assert [(r[0], r[1], r[6]) for r in rows] == [("explicit", 32, None), ("fused", 32, None)]
    for _, _, tokens, sequences, perplexity, _, _ in rows:
        assert math.isclose(tokens, sequences * 32, rel_tol=1e-9) and 1 < perplexity < 256 * 4
    assert rows[0][5] is None and rows[1][5]  # the fused kernel's backend, recorded in force
