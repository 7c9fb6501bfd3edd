"""Theano 1.0.5 as a matrun framework: the same networks as the zoo, real harness runs in the
real Theano environment (blas.ldflags empty: numpy's BLAS), the switches that reach Theano
(threads, its OpenMP, the compiled graph of first_layer_backward), the training knobs, what is
refused at plan time, the presets, and the Debian BLAS variants: each image built through
matrun's build path (its BLAS check and promises) and one cell run in it whose probe shows the
BLAS Theano's compiled ops really loaded."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from matrun.errors import InputError, MatrixError
from matrun.frameworks import get_framework, load_framework
from matrun.runner.executors.local import cell_environment
from matrun.runner.harness import models
from matrun.runner.harness.adapters import theano as theano_adapter
from matrun.runner.planning.matrix import parse_matrix
from test_harness import EVENT_KEYS, ZOO_PARITY, check_phases, events_of, only, write_spec

ROOT = Path(__file__).resolve().parents[1]
TH = {"framework": "theano", "env_id": "theano-cpu-test", "onednn": None}  # nulled for Theano, as the host does
ZOO = [zoo[:3] for zoo in ZOO_PARITY]
VARIANTS = {  # variant -> (blas.ldflags, what the probe must find)
    "cpu": ("", None),
    "cpu-openblas": ("-lopenblas", ("openblas", "0.3.21")),
    "cpu-blis": ("-lblas", ("blis", "0.9.0")),
    "cpu-reference": ("-lblas", ("reference", "3.11.0")),
}


def plan(**fixed: Any) -> dict[str, Any]:
    (cell,) = parse_matrix({"fixed": {"framework": "theano", "phase_sampling": 10, **fixed}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


def run_theano(python: Path, stage: Path, spec: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """The harness with exactly the environment the local executor gives the cell."""
    p = json.loads(spec.read_text(encoding="utf-8"))["params"]
    env = cell_environment(p, stage)
    return subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(spec), "--out", str(spec.parent)],
                          capture_output=True, text=True, env=env, cwd=spec.parent, timeout=timeout)


def in_theano(theano_env: Any, stage: Path, script: str) -> Any:
    """Run ``script`` in the Theano environment (the cpu variant's flags); its last stdout line as JSON."""
    proc = subprocess.run([str(theano_env.python), "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(stage),
                               "THEANO_FLAGS": "blas.ldflags=", "OMP_NUM_THREADS": "1",
                               "OPENBLAS_NUM_THREADS": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CONFIG = "dict(threads=1, seed=0)"
STEP = "forward+backward+update"  # Theano's training step: one compiled function


@pytest.fixture(scope="session")
def theano_env():
    """The real Theano environment the local executor uses (built once, then reused)."""
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("theano", "cpu")


# --- in the Theano environment -----------------------------------------------------------


@pytest.mark.slow
def test_every_network_has_the_zoo_parameter_count(theano_env, stage):
    """Counted from the shared variables the optimizer updates (BatchNorm's running statistics
    are not among them), nothing compiled; one layer per entry of the layer list."""
    found = in_theano(theano_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import theano as a
        a.configure({CONFIG})
        out = {{}}
        for name, shape, classes in {ZOO!r}:
            net = a.build(name, tuple(shape), classes)
            stats = sum(len(layer.stats) for layer in net.layers)
            out[name] = [a.parameter_count(net), [layer.name for layer in net.layers], stats]
        print(json.dumps(out))
    """)
    for name, shape, classes in ZOO:
        count, names, _ = found[name]
        assert count == models.param_count(name, shape, classes), name
        assert names == [layer[1] for layer in models.MODELS[name]], name
    assert found["resnet50"][0] == 25_557_032  # torchvision's ResNet-50
    assert found["resnet18"][2] == 2 * 20 and found["lenet5"][2] == 0  # running mean + var per BatchNorm


@pytest.mark.slow
def test_batchnorm_keeps_pytorchs_running_statistics(theano_env, stage):
    """Training: the batch's statistics (output mean 0, std 1); running mean and the unbiased
    variance updated with momentum 0.1, as PyTorch's; evaluation normalises with them."""
    found = in_theano(theano_env, stage, f"""
        import json
        import numpy as np
        from matrun.runner.harness.adapters import theano as a
        a.configure({CONFIG})
        T, theano = a.T, a.theano
        layer = a.Layer(("bn", "bn1"), 10, {{"c": 4, "h": 5, "w": 5, "flat": None}}, np.random.RandomState(0), None)
        x = T.tensor4(dtype="float32")
        y, updates = layer.apply(x, True)
        train = theano.function([x], y, updates=updates)
        evaluate = theano.function([x], layer.apply(x, False)[0])
        rng = np.random.RandomState(1)
        mean, var = np.zeros(4), np.ones(4)
        for _ in range(30):
            xb = (3 + 2 * rng.randn(8, 4, 5, 5)).astype("float32")
            out = train(xb)
            mean = 0.9 * mean + 0.1 * xb.mean(axis=(0, 2, 3))
            var = 0.9 * var + 0.1 * xb.var(axis=(0, 2, 3), ddof=1)
        e = evaluate(xb)
        print(json.dumps({{"train": [float(out.mean()), float(out.std())], "mean": layer.mean.get_value().tolist(),
                          "var": layer.var.get_value().tolist(), "expected": [mean.tolist(), var.tolist()],
                          "eval": [float(np.abs(e - (xb - mean.reshape(1, 4, 1, 1)) / np.sqrt(var.reshape(1, 4, 1, 1)
                                                                                            + 1e-5)).max())]}}))
    """)
    assert found["train"] == pytest.approx([0.0, 1.0], abs=1e-4)
    assert found["mean"] == pytest.approx(found["expected"][0], rel=1e-4)
    assert found["var"] == pytest.approx(found["expected"][1], rel=1e-4)
    assert found["eval"][0] < 1e-4


@pytest.mark.slow
def test_the_input_gradient_adds_the_first_convolutions_backward_data_pass(theano_env, stage):
    """Theano computes only the gradients asked for: with "full" the step asks for the input's
    too and consumes it, and the compiled step holds one CorrMM_gradInputs more (conv1's)."""
    found = in_theano(theano_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import theano as a
        a.configure({CONFIG})
        params = dict(optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=0.0)
        out = {{}}
        for full in (False, True):
            ops = a.Trainer(a.build("lenet5", (1, 28, 28), 10), params, input_gradient=full).ops()
            out[str(full)] = {{op: ops.count(op) for op in ("CorrMM", "CorrMM_gradInputs", "CorrMM_gradWeights")}}
        print(json.dumps(out))
    """)
    assert found["False"] == {"CorrMM": 2, "CorrMM_gradInputs": 1, "CorrMM_gradWeights": 2}
    assert found["True"] == {"CorrMM": 2, "CorrMM_gradInputs": 2, "CorrMM_gradWeights": 2}


@pytest.mark.slow
def test_the_optimizers_follow_pytorchs_formulas(theano_env, stage):
    """Two updates of w = [1, -2, 3] with the gradient c + wd·w (loss = Σ c·w), against the
    formulas written out in numpy (PyTorch's: SGD momentum, Adam, Adadelta, RMSprop)."""
    found = in_theano(theano_env, stage, f"""
        import json
        import numpy as np
        from matrun.runner.harness.adapters import theano as a
        a.configure({CONFIG})
        T, theano = a.T, a.theano
        out = {{}}
        for name in ("sgd", "adam", "adadelta", "rmsprop"):
            w = theano.shared(np.array([1.0, -2.0, 3.0], np.float32), name="w")
            loss = (w * np.array([0.5, 1.5, -1.0], np.float32)).sum()
            p = dict(optimizer=name, lr=0.1, momentum=0.9, weight_decay=0.01)
            step = theano.function([], [], updates=a.optimizer_updates(p, [w], theano.grad(loss, [w])))
            step(); step()
            out[name] = w.get_value().tolist()
        print(json.dumps(out))
    """)
    def torch_rule(name: str, w: float, c: float, wd: float = 0.01, lr: float = 0.1) -> float:
        s1 = s2 = 0.0
        for t in (1, 2):
            g = c + wd * w
            if name == "sgd":
                s1 = 0.9 * s1 + g
                w -= lr * s1
            elif name == "adam":
                s1, s2 = 0.9 * s1 + 0.1 * g, 0.999 * s2 + 0.001 * g * g
                w -= lr / (1 - 0.9 ** t) * s1 / (math.sqrt(s2) / math.sqrt(1 - 0.999 ** t) + 1e-8)
            elif name == "adadelta":
                s1 = 0.9 * s1 + 0.1 * g * g
                delta = math.sqrt(s2 + 1e-6) / math.sqrt(s1 + 1e-6) * g
                s2 = 0.9 * s2 + 0.1 * delta * delta
                w -= lr * delta
            else:
                s1 = 0.99 * s1 + 0.01 * g * g
                w -= lr * g / (math.sqrt(s1) + 1e-8)
        return w

    for name in ("sgd", "adam", "adadelta", "rmsprop"):
        expected = [torch_rule(name, w, c) for w, c in zip((1.0, -2.0, 3.0), (0.5, 1.5, -1.0))]
        assert found[name] == pytest.approx(expected, rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_harness_run_writes_every_event_type(tmp_path, theano_env, stage):
    spec = write_spec(tmp_path / "run", **TH, epochs=2, threads=1, layer_profile=True, onednn_check=True)
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "header" and kinds[-2:] == ["summary", "end"]
    for kind, keys in EVENT_KEYS.items():
        assert kind in kinds, kind
        for record in (e for e in events if e["type"] == kind):
            assert keys <= set(record), (kind, keys - set(record))
    probe = only(events, "probe")
    assert probe["framework"] == "theano" and probe["framework_version"] == "1.0.5"
    in_force = probe["in_force"]
    assert in_force["blas_ldflags"] == "" and in_force["floatX"] == "float32" and in_force["openmp"] is False
    assert in_force["compiled_in_c"]["CorrMM"] is True  # C code, its gemm through numpy's C API
    assert "numpy.libs" in in_force["blas"]["filepath"] and in_force["threads"] == 1
    assert probe["blas_loaded"] is None  # only numpy's and scipy's own copies are mapped
    # Theano has no oneDNN (the cell's onednn is null): the check counts nothing, nothing is amiss
    assert probe["onednn_primitives"] == 0 and probe.get("onednn_check_error") is None
    assert in_force["onednn"] is False and in_force["onednn_available"] is False
    assert probe["mismatches"] == []
    assert only(events, "model")["parameters"] == 61_706
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 2 * 16 and all(s["seconds"] > 0 for s in steps)
    # preloaded slices: the compiled step is the only phase, forward, backward and update fused
    check_phases(events, [STEP], sampled=[5 + 9, 5 + 19], gradient_element_bytes=None)
    layers = [e for e in events if e["type"] == "layer"]
    assert [e["name"] for e in layers] == [layer[1] for layer in models.LENET5]
    assert all(e["forward_seconds"] > 0 and e["backward_seconds"] > 0 for e in layers)
    summary = only(events, "summary")
    assert summary["timed_steps"] == 2 * 16 - 5 - 2 and 0.0 <= summary["accuracy"] <= 1.0  # 2 sampled
    assert summary["gradient_bytes"] == 61_706 * 4  # float32 (floatX)
    assert any("compiled before the first step" in n for n in summary["notes"])
    assert any("its own theano.function" in n for n in summary["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_reach_the_blas_theano_calls(tmp_path, theano_env, stage, threads):
    """The cpu variant: OPENBLAS_NUM_THREADS & co. size numpy's OpenBLAS, which Theano's ops call
    (threadpoolctl counts it); Theano's OpenMP stays off — asked for with blas.ldflags empty it
    would abort the process, so the adapter turns it off and says so."""
    spec = write_spec(tmp_path / "run", **TH, epochs=1, iterations=6, warmup_steps=2, threads=threads)
    p = json.loads(spec.read_text())["params"]
    env = cell_environment(p, stage, {"PATH": "/bin", "THEANO_FLAGS": "blas.ldflags=-lmkl_rt"})
    assert env["THEANO_FLAGS"] == "blas.ldflags="  # the variant's; the host's own never reaches the cell
    assert all(env[v] == str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS"))
    asked_openmp = threads == 2
    if asked_openmp:  # as a variant (or a hand-made environment) might
        env["THEANO_FLAGS"] = "blas.ldflags=,openmp=True"
    proc = subprocess.run([str(theano_env.python), "-m", "matrun.runner.harness", "--spec", str(spec), "--out",
                           str(spec.parent)], capture_output=True, text=True, env=env, cwd=spec.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    probe = only(events, "probe")
    in_force = probe["in_force"]
    assert in_force["threads"] == threads and in_force["blas_threads"] == threads and in_force["openmp"] is False
    assert probe["mismatches"] == []
    notes = only(events, "summary").get("notes", [])
    assert any(n.startswith("THEANO_FLAGS asked openmp=True, set False") for n in notes) == asked_openmp


@pytest.mark.slow
def test_a_resnet_trains(tmp_path, theano_env, stage):
    """Residual blocks (projection shortcuts, BatchNorm in training and evaluation) compile and train."""
    # batches of 4 (a step of ResNet-18 on one thread scales with the batch; BatchNorm still has 4
    # values a channel at 1×1)
    spec = write_spec(tmp_path / "run", **TH, model="resnet18", synthetic_shape=[3, 32, 32], synthetic_train=16,
                      synthetic_test=8, batch_size=4, epochs=None, iterations=4, warmup_steps=1, threads=1)
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert only(events, "model")["parameters"] == models.param_count("resnet18", (3, 32, 32), 10)
    summary = only(events, "summary")
    assert summary["diverged"] is False and summary["timed_steps"] == 3 and summary["accuracy"] is not None


@pytest.mark.slow
def test_inference_mode_times_forward_batches(tmp_path, theano_env, stage):
    spec = write_spec(tmp_path / "run", **TH, mode="inference", iterations=12, epochs=None, optimizer=None, lr=None,
                      momentum=None, weight_decay=None, model="cifar_cnn", synthetic_shape=[3, 32, 32],
                      batch_size=8, synthetic_test=32, layer_profile=True)  # (the work scales with the batch)
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 12 and [s["epoch"] for s in steps[-2:]] == [2, 2]  # 32 test samples: 4 batches a pass
    assert not [e for e in events if e["type"] == "epoch"]
    assert all(e["backward_seconds"] is None for e in events if e["type"] == "layer")
    summary = only(events, "summary")
    assert summary["accuracy"] is None and summary["inference_seconds"] > 0 and summary["throughput"] > 0


@pytest.mark.slow
def test_diverged_run_is_recorded_like_the_others(tmp_path, theano_env, stage):
    spec = write_spec(tmp_path / "run", **TH, lr=1e8, epochs=3, threads=1)
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert len([e for e in events if e["type"] == "epoch"]) == 1
    summary = only(events, "summary")
    assert summary["diverged"] is True and summary["accuracy"] is None
    assert any("stopped" in n for n in summary["notes"])


@pytest.mark.slow
def test_the_training_knobs(tmp_path, theano_env, stage):
    """first_layer_backward = "full" (every step computed the input's gradient), a validation split
    with early stopping (a learning rate too small to move the accuracy: stopped after the
    patience), and a loader of two threads feeding the same batches inside the step's clock."""
    spec = write_spec(tmp_path / "run", **TH, epochs=4, threads=1, lr=1e-9, first_layer_backward="full",
                      validation=128, early_stopping=1, input_pipeline="loader", loader_workers=2, optimizer="adam")
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert only(events, "data")["validation_size"] == 128 and only(events, "data")["train_size"] == 384
    epochs = [e for e in events if e["type"] == "epoch"]
    assert all(e["validation_accuracy"] is not None and e["validation_seconds"] > 0 for e in epochs)
    summary = only(events, "summary")
    assert (summary["epochs_run"], summary["best_epoch"], summary["stopped_early"]) == (2, 0, True)
    assert summary["first_layer_backward"] == "full" and summary["input_gradient_steps"] == 2 * 12
    pipeline = summary["input_pipeline"]
    assert pipeline["kind"] == "loader" and pipeline["workers"] == 2 and pipeline["workers_seen"] == 2
    assert pipeline["batches"] == 2 * 12 and pipeline["batches_in_process"] == 0
    # the loader's fetch is inside the step's clock: its own phase, before the compiled step
    check_phases(events, ["input", STEP], sampled=[5 + 9], gradient_element_bytes=None)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, lr", [("adam", 0.002), ("adadelta", 1.0), ("rmsprop", 0.001)])
def test_every_optimizer_with_weight_decay_learns(tmp_path, theano_env, stage, optimizer, lr):
    spec = write_spec(tmp_path / "run", **TH, epochs=3, threads=1, optimizer=optimizer, lr=lr, weight_decay=5e-4)
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    epochs = [e for e in events_of(spec.parent) if e["type"] == "epoch"]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] and not only(events_of(spec.parent), "summary")["diverged"]


@pytest.mark.slow
def test_lenet5_learns_real_fashion_mnist(tmp_path, theano_env, stage, fashion_mnist_root):
    spec = write_spec(tmp_path / "run", fashion_mnist_root, **TH, dataset="fashion-mnist", synthetic_shape=None,
                      synthetic_classes=None, synthetic_train=None, synthetic_test=None, train_limit=6000,
                      test_limit=1000, epochs=1, batch_size=64, lr=0.05, threads=2)
    proc = run_theano(theano_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert only(events, "data")["train_size"] == 6000
    assert only(events, "summary")["accuracy"] > 0.6


# --- the Debian BLAS variants, in their images ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_image_runs_a_cell_on_its_promised_blas(tmp_path, docker_client, variant):
    """Each image is built through matrun's build path (the Dockerfile's own BLAS check, then the
    probe against the variant's promises), then one cell runs in it under the docker executor
    (read-only root, /tmp noexec: Theano compiles into the image's compile cache the executor
    mounts, the oneDNN check's short run too, and nothing of it lands in the bundle); in the
    cpu image a second cell finds every module there and compiles none.  cpu-openblas and cpu-blis run 2
    threads: their libraries' own pools (threadpoolctl asks OpenBLAS; BLIS reads BLIS_NUM_THREADS)."""
    from conftest import built_image
    from matrun.runner.executors.docker import COMPILE_CACHE_MOUNT, DockerExecutor, cell_user, compile_cache
    from matrun.runner.executors.protocol import RunRequest
    from matrun.warehouse.bundles.layout import SPEC
    from matrun.warehouse.bundles.write import write_json_atomic

    image = built_image(docker_client, "theano", variant)
    ldflags, promised = VARIANTS[variant]
    env = dict(item.split("=", 1) for item in docker_client.images.get(image.tag).attrs["Config"]["Env"])
    assert "THEANO_FLAGS" not in env  # the cell's flags are the variant's env, never the image's
    threads = 2 if variant in ("cpu-openblas", "cpu-blis") else 1
    p = plan(variant=variant, dataset="synthetic", synthetic_train=256, synthetic_test=64, batch_size=32, epochs=1,
             warmup_steps=2, threads=threads, onednn_check=True)
    assert cell_environment(p, Path("/h"), {})["THEANO_FLAGS"] == f"blas.ldflags={ldflags}"
    run_dir = tmp_path / "bundle"
    run_dir.mkdir()
    write_json_atomic(run_dir / SPEC, {"schema_version": 1, "sweep": f"test-{uuid.uuid4().hex[:8]}",
                                       "cell_id": "c" * 16, "repeat": 0, "attempt": 1, "env_id": "e",
                                       "data_dir": "/nonexistent", "params": p})
    outcome = DockerExecutor(docker_client).run(RunRequest(run_dir=run_dir, params=p, env_id="e", timeout=900,
                                                           data_dir=Path("/nonexistent")))
    assert outcome.status == "ok", outcome.error_tail
    assert not (run_dir / theano_adapter.COMPILE_DIR).exists()  # nothing compiled in the bundle
    ref = DockerExecutor(docker_client).image("theano", variant)
    cache = compile_cache(p, ref, cell_user(run_dir))
    modules = sorted(cache.rglob("*.so"))
    assert modules  # the step's, the evaluation's and the probe's modules
    events = events_of(run_dir)
    probe = only(events, "probe")
    in_force = probe["in_force"]
    assert in_force["blas_ldflags"] == ldflags and in_force["compiledir"].startswith(COMPILE_CACHE_MOUNT + "/")
    assert probe["onednn_primitives"] == 0 and probe.get("onednn_check_error") is None
    assert probe["mismatches"] == []
    assert in_force["threads"] == threads
    if promised is None:  # numpy's own OpenBLAS through its C API
        assert probe["blas_loaded"] is None and "numpy.libs" in in_force["blas"]["filepath"]
        assert in_force["compiled_in_c"] == {"Dot22": False, "Elemwise": True, "CorrMM": True}
    else:
        loaded = probe["blas_loaded"]
        assert (loaded["provider"], loaded["version"]) == promised, loaded
        assert "/usr/lib/x86_64-linux-gnu/" in loaded["path"]
        assert in_force["compiled_in_c"] == {"Dot22": True, "Elemwise": True, "CorrMM": True}
    assert in_force["openmp"] is False and in_force["blas_threads"] == (None if variant == "cpu-reference" else threads)
    summary = only(events, "summary")
    assert summary["accuracy"] is not None and summary["throughput"] > 0
    if variant != "cpu":
        return
    again = tmp_path / "again"
    again.mkdir()
    write_json_atomic(again / SPEC, {**json.loads((run_dir / SPEC).read_text()), "repeat": 1})
    outcome = DockerExecutor(docker_client).run(RunRequest(run_dir=again, params=p, env_id="e", timeout=900,
                                                           data_dir=Path("/nonexistent")))
    assert outcome.status == "ok", outcome.error_tail
    assert sorted(cache.rglob("*.so")) == modules  # every module found, none compiled again
    assert only(events_of(again), "summary")["accuracy"] is not None


# --- host side -------------------------------------------------------------------------


REFUSED = [
    ({"layout": "nhwc"}, "Theano's conv2d and pool_2d take NCHW tensors (batch, channels, rows, columns) only: "
                         "it has no channels-last convolution"),
    ({"precision": "fp16"}, "Theano 1.0.5 has no fp16 mixed precision on the CPU: its C convolutions (CorrMM) and "
                            "BLAS ops (Gemm, Dot22) compute in float32 or float64 only"),
    ({"precision": "bf16"}, "Theano has no bfloat16 type (its dtypes are numpy's)"),
    ({"precision": "tf32"}, "TF32 is a feature of NVIDIA Ampere and later GPUs"),
    ({"interop_threads": 2}, "Theano's VM runs the ops of a compiled function one after another in the calling "
                             "thread: there is no inter-op pool to size"),
    ({"workers": 2}, "Theano has no data-parallel training across processes of its own (Platoon, a separate "
                     "project, served its GPU back end): matrun runs Theano in one process"),
    ({"nodes": 2}, "Theano has no data-parallel training across processes of its own (Platoon, a separate "
                   "project, served its GPU back end): matrun runs Theano in one process"),
]


@pytest.mark.parametrize("fixed, reason", REFUSED,
                         ids=["nhwc", "fp16", "bf16", "tf32", "interop", "workers", "nodes"])
def test_what_theano_cannot_do_is_refused_at_plan_time(fixed, reason):
    with pytest.raises(MatrixError) as info:
        plan(**fixed)
    assert str(info.value) == f"matrix.toml: [fixed] theano cannot run this cell: {reason}"


def test_a_gpu_cell_and_a_cifar10_default_preset_are_refused():
    with pytest.raises(MatrixError) as info:
        plan(device="gpu")
    assert 'variant "cpu" of theano is a CPU build; a gpu cell needs one of: none' in str(info.value)
    with pytest.raises(MatrixError) as info:
        plan(dataset="cifar10", preset="framework-default")
    assert ("preset \"framework-default\" has no theano example for dataset 'cifar10' "
            "(it has: mnist, fashion-mnist)") in str(info.value)


def test_what_theano_can_do_is_planned():
    # onednn: Theano has none (framework.toml onednn = false): the value is nulled, one cell either way
    (on,), (off,) = (parse_matrix({"fixed": {"framework": "theano", "onednn": v}}, path=Path("m.toml")).cells
                     for v in (True, False))
    assert on.values["onednn"] is None and on.identity == off.identity
    assert plan(threads=2)["threads"] == 2
    assert plan(variant="cpu-blis")["variant"] == "cpu-blis"
    assert plan(mode="inference", layer_profile=True)["mode"] == "inference"


def test_adapter_check_refuses_what_it_cannot_build():
    base = plan(dataset="synthetic")
    assert theano_adapter.check(base) is None
    assert theano_adapter.check({**base, "model": "vgg"}).startswith("[params -> model] unknown model")
    assert theano_adapter.check({**base, "model": "alexnet"}).startswith("[params -> synthetic_shape] alexnet needs")
    # a spec made by hand gets the plan-time refusals too (a bad spec, exit 2, instead of a crash)
    assert theano_adapter.check({**base, "device": "gpu", "gpus": 1}).startswith("[params -> device]")
    assert theano_adapter.check({**base, "layout": "nhwc"}).startswith("[params -> layout]")
    assert theano_adapter.check({**base, "precision": "bf16"}).startswith("[params -> precision] bf16")
    assert theano_adapter.check({**base, "interop_threads": 2}).startswith("[params -> interop_threads]")
    assert theano_adapter.check({**base, "workers": 2}).startswith("[params -> workers]")


def test_framework_default_preset_is_the_lenet_tutorial():
    cell = plan(preset="framework-default")
    assert (cell["optimizer"], cell["lr"], cell["momentum"], cell["batch_size"], cell["epochs"]) == (
        "sgd", 0.1, 0.0, 500, 200)
    assert (cell["validation"], cell["early_stopping"]) == (10_000, 100)
    short = plan(preset="framework-default", epochs=2)  # the matrix's own length wins
    assert short["epochs"] == 2 and short["early_stopping"] == 100


def test_study_a_preset_is_tables_ii_and_iii():
    mnist = plan(preset="study-a", dataset="mnist")
    assert (mnist["optimizer"], mnist["lr"], mnist["momentum"], mnist["batch_size"], mnist["epochs"],
            mnist["iterations"], mnist["validation"], mnist["early_stopping"]) == (
        "sgd", 0.1, 0.0, 500, 200, 0, 10_000, 100)
    cifar = plan(preset="study-a", dataset="cifar10", model="cifar_cnn")
    assert (cifar["optimizer"], cifar["lr"], cifar["momentum"], cifar["batch_size"], cifar["iterations"],
            cifar["epochs"]) == ("sgd", 0.01, 0.9, 50, 50_000, None)
    # 200 epochs of 50,000 / 500 = Table II's 20,000 iterations
    assert mnist["epochs"] * (60_000 - mnist["validation"]) // mnist["batch_size"] == 20_000


def test_each_variant_hands_its_cells_its_blas_ldflags():
    fw = get_framework("theano")
    for variant, (ldflags, _) in VARIANTS.items():
        env = cell_environment(plan(variant=variant), Path("/s"), {"THEANO_FLAGS": "openmp=True", "THEANORC": "/x"})
        assert env["THEANO_FLAGS"] == f"blas.ldflags={ldflags}" and "THEANORC" not in env, variant
        assert fw.variants[variant].requirements == (None if variant != "cpu" else "requirements-cpu.txt")


def test_the_debian_images_pin_what_requirements_pin():
    pins = [line for line in (ROOT / "images/theano/requirements-cpu.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    dockerfile = (ROOT / "images/theano/Dockerfile.debian").read_text()
    (install,) = re.findall(r"/opt/venv/bin/pip install ((?:\S+==\S+ ?)+)", dockerfile)
    assert install.split() == pins


def test_a_variants_env_is_checked_and_part_of_its_identity(tmp_path):
    from matrun.runner.environments.contexts import recipe_hash
    from matrun.runner.environments.venvs import EnvSpec, env_spec

    folder = tmp_path / "theano"
    shutil.copytree(ROOT / "images" / "theano", folder)
    toml = folder / "framework.toml"
    text = toml.read_text()
    toml.write_text(text.replace('env = { THEANO_FLAGS = "blas.ldflags=-lblas" }',
                                 'env = { "THEANO FLAGS" = "blas.ldflags=-lblas" }', 1))
    with pytest.raises(InputError, match=r"\[variants.cpu-blis\]: env names 'THEANO FLAGS', which are not variable"):
        load_framework(folder)
    toml.write_text(text.replace('env = { THEANO_FLAGS = "blas.ldflags=-lblas" }', 'env = { THEANO_FLAGS = 1 }', 1))
    with pytest.raises(InputError, match=r"\[variants.cpu-blis\]: env must map names to strings"):
        load_framework(folder)
    toml.write_text(text.replace('env = { THEANO_FLAGS = "blas.ldflags=-lblas" }',
                                 'env = { THEANO_FLAGS = "blas.ldflags=-lopenblas" }', 1))
    assert recipe_hash("theano", "cpu-blis", tmp_path) != recipe_hash("theano", "cpu-blis")
    spec = env_spec("theano", "cpu")
    assert spec.env == (("THEANO_FLAGS", "blas.ldflags="),)
    assert EnvSpec(spec.framework, spec.variant, spec.requirements).env_id != spec.env_id


def test_the_compile_cache_an_executor_mounted_comes_first_where_it_is_usable(tmp_path, monkeypatch):
    """$MATRUN_COMPILE_CACHE (the docker executor's per-image cache) before the host's shared
    one; one that cannot be written to falls through to the next."""
    monkeypatch.setattr(theano_adapter.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("MATRUN_COMPILE_CACHE", str(tmp_path / "mounted"))
    assert theano_adapter.compile_home() == (str(tmp_path / "mounted"), False)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MATRUN_COMPILE_CACHE", str(blocker / "cache"))
    assert theano_adapter.compile_home() == (str(tmp_path / "tmp" / f"matrun-theano-{__import__('os').getuid()}"), False)


def test_the_compile_directory_is_a_shared_cache_where_the_host_allows(tmp_path, monkeypatch):
    monkeypatch.delenv("MATRUN_COMPILE_CACHE", raising=False)
    monkeypatch.setattr(theano_adapter.tempfile, "gettempdir", lambda: str(tmp_path))
    home, own = theano_adapter.compile_home()
    assert (home, own) == (str(tmp_path / f"matrun-theano-{__import__('os').getuid()}"), False)
    assert Path(home).is_dir()
    assert theano_adapter._parse_flags("blas.ldflags=-L/x -lblas,openmp=True,openmp=False") == {
        "blas.ldflags": "-L/x -lblas", "openmp": "False"}
