"""TensorFlow 2.21 (Keras 3) as a matrun framework: the same networks as the zoo, real harness
runs in the real TensorFlow environment, the switches that reach the cell, and what is refused
at plan time."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from matrun.errors import MatrixError
from matrun.runner.executors.local import cell_environment
from matrun.runner.harness import models
from matrun.runner.harness.adapters import tensorflow as tf_adapter
from matrun.runner.harness.phases import CALIBRATION_BYTES
from matrun.runner.planning.matrix import parse_matrix
from test_harness import EVENT_KEYS, ZOO_PARITY, check_phases, events_of, only, run_harness, write_spec
from test_local_executor import run_cell
from test_workers import CPUSET, check_two_workers, run_local
from test_workers import params as worker_params

TF = {"framework": "tensorflow", "env_id": "tensorflow-cpu-test"}
ZOO = [zoo[:3] for zoo in ZOO_PARITY]


def plan(**fixed: Any) -> dict[str, Any]:
    (cell,) = parse_matrix({"fixed": {"framework": "tensorflow", **fixed}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


def run_tf(python: Path, stage: Path, spec: Path) -> subprocess.CompletedProcess[str]:
    """The harness with exactly the environment the local executor gives the cell."""
    params = json.loads(spec.read_text(encoding="utf-8"))["params"]
    env = cell_environment(params, stage)
    return subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(spec), "--out", str(spec.parent)],
                          capture_output=True, text=True, env=env, cwd=spec.parent, timeout=180)


# --- in the TensorFlow environment -----------------------------------------------------


@pytest.mark.slow
def test_every_network_has_the_zoo_parameter_count_and_shapes(tf_env, stage):
    script = textwrap.dedent(f"""
        import json
        from matrun.runner.harness.adapters import tensorflow as a
        a.configure(dict(threads=1, interop_threads="unset", onednn=True, device="cpu", conv_algo="heuristic",
                         seed=0, layout="nchw", precision="fp32"))
        found = {{}}
        for layout in ("nchw", "nhwc"):
            for name, shape, classes in {ZOO!r}:
                net = a.build(name, shape, classes, layout)
                shapes = {{}}
                for unit in net.units:
                    out = tuple(unit.output.shape[1:])
                    if len(out) == 3 and layout == "nhwc":
                        out = (out[2], out[0], out[1])
                    shapes[unit.name] = list(out)
                found[f"{{layout}} {{name}}"] = [a.trainable_parameters(net.model), shapes]
        print(json.dumps(found))
    """)
    proc = subprocess.run([str(tf_env.python), "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(stage), "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for layout in ("nchw", "nhwc"):
        for name, shape, classes in ZOO:
            count, shapes = found[f"{layout} {name}"]
            assert count == models.param_count(name, shape, classes), (layout, name)
            walked = {layer["name"]: list(layer["out"]) for layer in models.walk(name, shape, classes)}
            for unit, out in shapes.items():  # every unit the zoo lists has the zoo's output shape (C, H, W)
                if unit in walked:
                    assert out == walked[unit], (layout, name, unit)
    assert found["nhwc resnet50"][0] == 25_557_032  # torchvision's ResNet-50
    assert found["nchw resnet50"][1]["res5c"] == [2048, 7, 7]


@pytest.mark.slow
def test_data_parallel_step_equals_the_single_device_step(tf_env, stage):
    """The MirroredStrategy step of gpus > 1, over two logical CPUs (no GPU here): each replica
    takes every other sample, gradients are summed, so losses and weights equal one device's."""
    script = textwrap.dedent("""
        import json
        from matrun.runner.harness.adapters import tensorflow as a
        a.configure(dict(threads=2, interop_threads="unset", onednn=True, device="cpu", conv_algo="heuristic",
                         seed=0, layout="nhwc", precision="fp32"))
        tf, keras = a.tf, a.keras
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        params = dict(optimizer="sgd", lr=0.01, momentum=0.9, precision="fp32", weight_decay=0.0)
        x = tf.random.normal((64, 28, 28, 1), seed=1)
        y = tf.random.uniform((64,), 0, 10, dtype=tf.int64, seed=2)
        found = []
        for strategy in (None, tf.distribute.MirroredStrategy(devices=["/cpu:0", "/cpu:1"])):
            keras.utils.set_random_seed(0)
            with (strategy.scope() if strategy else tf.device("/CPU:0")):
                net = a.build("lenet5", (1, 28, 28), 10, "nhwc")
                opt = a.make_optimizer(params)
                opt.build(net.model.trainable_variables)
            step = a.train_step(net.model, opt, 0.0, (1, 28, 28), "nhwc", strategy)
            sums = [[float(t) for t in step(x, y)] for _ in range(3)] + [[float(t) for t in step(x[:37], y[:37])]]
            found.append([sums, [float(tf.reduce_sum(v)) for v in net.model.trainable_variables]])
        print(json.dumps(found))
    """)
    proc = subprocess.run([str(tf_env.python), "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(stage), "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    (one_sums, one_weights), (two_sums, two_weights) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [s[0] for s in two_sums] == pytest.approx([s[0] for s in one_sums], rel=1e-5)  # summed losses
    assert [s[1] for s in two_sums] == [s[1] for s in one_sums]  # correct counts
    assert two_weights == pytest.approx(one_weights, rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_harness_run_writes_every_event_type(tmp_path, tf_env, stage):
    spec = write_spec(tmp_path / "run", **TF, epochs=2, threads=1, interop_threads=1, layer_profile=True,
                      onednn_check=True)
    proc = run_tf(tf_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "header" and kinds[-2:] == ["summary", "end"]
    for kind, keys in EVENT_KEYS.items():
        assert kind in kinds, kind
        for event in (e for e in events if e["type"] == kind):
            assert keys <= set(event), (kind, keys - set(event))
    assert only(events, "model")["parameters"] == 61_706
    assert only(events, "model")["flops"] == models.forward_flops("lenet5", (1, 28, 28), 10)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 2 * 16  # 512 samples in batches of 32, two epochs
    assert [s["phase"] for s in steps[:6]] == ["warmup"] * 5 + ["timed"]
    assert steps[0]["seconds"] > 5 * sorted(s["seconds"] for s in steps)[16]  # step 0 traces the tf.function
    summary = only(events, "summary")
    # 27 steps after the warm-up, of which timed steps 9 and 19 (steps 14 and 24) are sampled
    assert (summary["warmup_steps"], summary["timed_steps"]) == (5, 25)
    # preloaded tensors on the CPU: the one tf.function call is forward, backward and update
    assert [r["step"] for r in check_phases(events, ["forward+backward+update"], check_throughput=False)] == [14, 24]
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["diverged"] is False
    assert all(0.0 <= e["train_accuracy"] <= 1.0 for e in events if e["type"] == "epoch")
    probe = only(events, "probe")
    assert probe["framework_version"] == "2.21.0"
    assert (probe["in_force"]["threads"], probe["in_force"]["interop_threads"]) == (1, 1)
    assert probe["in_force"]["thread_census"]["tf_Compute"] == 1  # the inter-op pool, counted
    assert probe["in_force"]["onednn"] is True and probe["in_force"]["layout"] == "channels_first"
    assert "is_cuda_build=False" in probe["build"]
    assert probe["mismatches"] == []
    assert probe["onednn_primitives"] > 0 and probe["onednn_primitive_kinds"]["convolution"] > 0
    layers = [e for e in events if e["type"] == "layer"]
    assert [e["name"] for e in layers] == [layer[1] for layer in models.LENET5]
    assert all(e["forward_seconds"] > 0 and e["backward_seconds"] > 0 for e in layers)


@pytest.mark.slow
def test_two_workers_time_phases_and_calibrate_the_all_reduce(tmp_path, tf_env):
    """MultiWorkerMirroredStrategy, two workers fed by tf.data: every worker samples the same
    steps, the loader's ``next`` apart from the step's graph (which all-reduces the gradients
    inside); before training the strategy's own all-reduce is timed over four sizes."""
    p = worker_params(framework="tensorflow", workers=2, iterations=22, input_pipeline="loader", loader_workers=1,
                      **CPUSET)
    outcome, run_dir = run_local(tmp_path, p)
    summary = check_two_workers(outcome, run_dir)  # (was test_workers' own TensorFlow test)
    assert "all-reduce" in summary["exchange"]["method"]
    order = ["input", "forward+backward+exchange+update"]
    assert [r["step"] for r in check_phases(events_of(run_dir), order, check_throughput=False)] == [11, 21]  # warm-up 2: timed 9, 19
    other = events_of(run_dir / "workers" / "worker-1")
    assert [r["step"] for r in check_phases(other, order, check_throughput=False)] == [11, 21]
    calibrated = summary["exchange"]["calibration"]
    assert [b for b, _ in calibrated["points"]] == list(CALIBRATION_BYTES) == sorted(CALIBRATION_BYTES)
    assert all(seconds > 0 for _, seconds in calibrated["points"])
    # (which size takes longer is a measurement, not asserted: on a loaded 2-core host a 4 KiB
    # all-reduce once took longer than a 4 MiB one, 3.65 ms against 3.43 ms, in CI)
    assert calibrated["bandwidth_bytes_per_s"] is None or calibrated["bandwidth_bytes_per_s"] > 0
    assert calibrated["latency_s"] is None or calibrated["latency_s"] >= 0
    assert (calibrated["pattern"], calibrated["transport"], calibrated["workers"],
            calibrated["overlaps_backward"]) == ("ring all-reduce", "grpc", 2, False)
    # the other worker measured the same collective (every worker enters it)
    assert [b for b, _ in only(other, "summary")["exchange"]["calibration"]["points"]] == list(CALIBRATION_BYTES)


@pytest.mark.slow
def test_inference_and_layer_profile(tmp_path, tf_env, stage):
    spec = write_spec(tmp_path / "run", **TF, mode="inference", iterations=10, epochs=None, optimizer=None,
                      lr=None, momentum=None, weight_decay=None, layer_profile=True, layout="nhwc", threads=1)
    proc = run_tf(tf_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 10 and [s["epoch"] for s in steps[-2:]] == [2, 2]  # 128 test samples: 4 batches a pass
    assert not [e for e in events if e["type"] == "epoch"]
    layers = [e for e in events if e["type"] == "layer"]
    assert [e["name"] for e in layers] == [layer[1] for layer in models.LENET5]
    assert all(e["forward_seconds"] > 0 and e["backward_seconds"] is None for e in layers)
    summary = only(events, "summary")
    assert summary["accuracy"] is None and summary["inference_seconds"] > 0 and summary["throughput"] > 0


@pytest.mark.slow
def test_bf16_nhwc_with_weight_decay_learns(tmp_path, tf_env, stage):
    spec = write_spec(tmp_path / "run", **TF, precision="bf16", layout="nhwc", weight_decay=5e-4, epochs=1,
                      threads=1)
    proc = run_tf(tf_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    assert only(events, "probe")["in_force"]["precision_policy"] == "mixed_bfloat16"
    assert only(events, "summary")["accuracy"] > 0.2  # 10 classes: above chance after one epoch


@pytest.mark.slow
def test_diverged_run_is_recorded_like_torch(tmp_path, tf_env, stage):
    spec = write_spec(tmp_path / "run", **TF, lr=1e8, epochs=3, threads=1)
    proc = run_tf(tf_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    assert len([e for e in events if e["type"] == "epoch"]) == 1
    summary = only(events, "summary")
    assert summary["diverged"] is True and summary["accuracy"] is None


@pytest.mark.slow
def test_onednn_off_reaches_the_cell(tmp_path, tf_env):
    p = plan(dataset="synthetic", synthetic_train=256, synthetic_test=64, batch_size=32, epochs=1,
             warmup_steps=2, threads=1, onednn=False, layout="nhwc", onednn_check=True)
    env = cell_environment(p, Path("/stage"), {"PATH": "/bin", "TF_ENABLE_ONEDNN_OPTS": "1"})
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert (env["TF_NUM_INTRAOP_THREADS"], env["OMP_NUM_THREADS"]) == ("1", "1")
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1" and "TF_NUM_INTEROP_THREADS" not in env
    assert cell_environment({**p, "interop_threads": 2}, Path("/s"), {})["TF_NUM_INTEROP_THREADS"] == "2"

    outcome, run_dir = run_cell(tmp_path, p, timeout=180)
    assert outcome.status == "ok", outcome.error_tail
    probe = only(events_of(run_dir), "probe")
    assert probe["in_force"]["onednn"] is False
    assert probe["in_force"]["layout"] == "channels_last"
    # Eigen's matrix products still call oneDNN's gemm with the oneDNN rewrite off: the check
    # counts them (and only them), and since no oneDNN layer primitive ran, flags nothing.
    assert set(probe["onednn_primitive_kinds"]) == {"gemm_api"} and probe["onednn_primitives"] > 0
    assert probe["mismatches"] == []
    assert "oneDNN custom operations are on" not in (run_dir / "stderr.log").read_text()


@pytest.mark.slow
def test_gpu_asked_without_gpu_fails_the_run(tmp_path, tf_env, stage):
    spec = write_spec(tmp_path / "run", **TF, device="gpu", gpus=1, threads=1)
    proc = run_tf(tf_env.python, stage, spec)
    assert proc.returncode == 1
    assert "TensorFlow sees no GPU" in proc.stderr.strip().splitlines()[-1]
    probe = only(events_of(spec.parent), "probe")
    assert probe["in_force"]["device"] == "cpu"
    assert any(m.startswith("device: asked gpu, in force cpu") for m in probe["mismatches"])


@pytest.mark.slow
def test_lenet5_learns_real_fashion_mnist(tmp_path, tf_env, stage, fashion_mnist_root):
    spec = write_spec(tmp_path / "run", fashion_mnist_root, **TF, dataset="fashion-mnist",
                      synthetic_shape=None, synthetic_classes=None, synthetic_train=None, synthetic_test=None,
                      train_limit=6000, test_limit=1000, epochs=1, batch_size=64, lr=0.05, threads=2,
                      layout="nhwc")
    proc = run_tf(tf_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    assert only(events, "data")["train_size"] == 6000
    assert only(events, "summary")["accuracy"] > 0.6


# --- host side -------------------------------------------------------------------------


REFUSED = [
    ({"onednn": False},  # layout defaults to nchw
     'matrix.toml: [fixed] tensorflow cannot run this cell: TensorFlow\'s Eigen CPU kernels (onednn = false) '
     'support only NHWC: "The Conv2D op currently only supports the NHWC tensor format on the CPU"; use '
     'layout = "nhwc" (with onednn = true, NCHW runs through oneDNN)'),
    ({"precision": "tf32"},
     "matrix.toml: [fixed] tensorflow cannot run this cell: TF32 is a feature of NVIDIA Ampere and later GPUs"),
    ({"device": "gpu"},
     'matrix.toml: [fixed] variant "cpu" of tensorflow is a CPU build; a gpu cell needs one of: cuda, cuda-pypi'),
]


@pytest.mark.parametrize("fixed, message", REFUSED, ids=["nchw-eigen", "tf32", "gpu-on-cpu-wheel"])
def test_what_tensorflow_cannot_do_is_refused_at_plan_time(fixed, message):
    with pytest.raises(MatrixError) as info:
        plan(**fixed)
    assert str(info.value) == message


def test_what_tensorflow_can_do_is_planned():
    assert plan(onednn=False, layout="nhwc")["onednn"] is False
    assert plan(precision="fp16")["precision"] == "fp16"  # runs on the CPU (slowly): measured, not refused
    assert plan(precision="bf16", onednn=False, layout="nhwc")["precision"] == "bf16"


def test_adapter_check_refuses_what_it_cannot_build():
    base = plan(dataset="synthetic")
    assert tf_adapter.check(base) is None
    assert tf_adapter.check({**base, "model": "vgg"}).startswith("[params -> model] unknown model")
    assert tf_adapter.check({**base, "model": "alexnet"}).startswith("[params -> synthetic_shape] alexnet needs")
    assert tf_adapter.check({**base, "model": "resnet50", "synthetic_shape": [3, 64, 64]}) is None
    # a spec made by hand gets the plan-time refusals too (a bad spec, exit 2, instead of a crash)
    assert tf_adapter.check({**base, "onednn": False}).startswith(
        "[params -> layout] TensorFlow's Eigen CPU kernels (onednn = false) support only NHWC")
    assert tf_adapter.check({**base, "onednn": False, "layout": "nhwc"}) is None
    assert tf_adapter.check({**base, "precision": "tf32"}).startswith("[params -> precision] TF32")


def test_framework_default_preset_is_the_keras_example():
    cell = plan(preset="framework-default")
    assert (cell["optimizer"], cell["lr"], cell["batch_size"], cell["epochs"]) == ("adam", 0.001, 128, 15)
