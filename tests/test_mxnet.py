"""MXNet 1.9.1 as a matrun framework: the same networks as the zoo, real harness runs in the
real MXNet environment (phase-sampled steps and the parameter-server calibration included), the
switches that reach the cell, and what is refused at plan time."""

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
from matrun.runner.harness.adapters import mxnet as mxnet_gluon
from matrun.runner.planning.matrix import parse_matrix
from test_harness import EVENT_KEYS, ZOO_PARITY, check_phases, events_of, only, run_harness, write_spec
from test_local_executor import run_cell
from test_workers import TWO_CPUS, check_two_workers, params as worker_params, run_local

MX = {"framework": "mxnet", "env_id": "mxnet-cpu-test"}
ZOO = [zoo[:3] for zoo in ZOO_PARITY]


def plan(**fixed: Any) -> dict[str, Any]:
    (cell,) = parse_matrix({"fixed": {"framework": "mxnet", "phase_sampling": 10, **fixed}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


# --- in the MXNet environment ----------------------------------------------------------


@pytest.mark.slow
def test_every_network_has_the_zoo_parameter_count(mxnet_env, stage):
    script = textwrap.dedent(f"""
        import json
        from matrun.runner.harness.adapters import mxnet as a
        a.configure(dict(threads=1, interop_threads="unset", onednn=True, device="cpu",
                         conv_algo="heuristic", seed=0))
        counts = {{}}
        for name, shape, classes in {ZOO!r}:
            net = a.build(name, shape, classes)
            kinds = {{p.grad_req for p in net.collect_params().values()}}
            counts[name] = [a.parameter_count(net), sorted(kinds)]
        print(json.dumps(counts))
    """)
    proc = subprocess.run([str(mxnet_env.python), "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(stage), "OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, shape, classes in ZOO:
        assert counts[name][0] == models.param_count(name, shape, classes), name
    assert counts["resnet50"][0] == 25_557_032  # torchvision's ResNet-50
    assert counts["resnet18"][1] == ["null", "write"]  # BatchNorm's running statistics are not trained


@pytest.mark.slow
def test_harness_run_writes_every_event_type(tmp_path, mxnet_env, stage):
    spec = write_spec(tmp_path / "run", **MX, epochs=2, layer_profile=True, onednn_check=True)
    proc = run_harness(mxnet_env.python, stage, spec, threads=1)
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
    assert all(s["seconds"] > 0 for s in steps)
    # every 10th timed step is sampled (BASE_PARAMS' phase_sampling): preloaded batches, one context
    assert [r["step"] for r in check_phases(events, ["forward", "backward", "update"])] == [14, 24]
    summary = only(events, "summary")
    assert (summary["warmup_steps"], summary["timed_steps"]) == (5, 25)
    assert summary["gradient_bytes"] == 61_706 * 4
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["diverged"] is False
    assert summary["throughput"] > 0
    layers = [e for e in events if e["type"] == "layer"]
    assert [e["name"] for e in layers] == [layer[1] for layer in models.LENET5]
    assert all(e["forward_seconds"] > 0 and e["backward_seconds"] > 0 for e in layers)
    probe = only(events, "probe")
    assert probe["framework_version"] == "1.9.1"
    assert probe["in_force"]["threads"] == 1
    assert probe["in_force"]["onednn"] is True
    assert probe["in_force"]["openblas_coretype"] == "Haswell"
    assert "MKLDNN" in probe["build"]
    assert probe["mismatches"] == []
    assert probe.get("onednn_check_error") is None, probe.get("onednn_check_error")
    assert probe["onednn_primitives"] > 0 and probe["onednn_primitive_kinds"]["convolution"] > 0


@pytest.mark.slow
def test_loader_steps_sample_the_fetch_as_input(tmp_path, mxnet_env, stage):
    spec = write_spec(tmp_path / "run", **MX, epochs=None, iterations=9, warmup_steps=2, phase_sampling=3,
                      input_pipeline="loader", loader_workers=1)
    proc = run_harness(mxnet_env.python, stage, spec, threads=1)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    assert [r["step"] for r in check_phases(events, ["input", "forward", "backward", "update"], every=3)] == [4, 7]
    summary = only(events, "summary")
    assert summary["input_pipeline"]["kind"] == "loader" and summary["input_pipeline"]["workers_seen"] == 1
    assert "exchange" not in summary  # one process: no kvstore exchange, no calibration


def initial_checksum(python: Path, stage: Path, p: dict[str, Any]) -> float:
    """Sum of |w| of the cell's network as the adapter initialises it (same seed), before any step."""
    script = textwrap.dedent(f"""
        from matrun.runner.harness.adapters import mxnet as a
        p = {p!r}
        a.configure(p)
        net = a.build(p["model"], tuple(p["synthetic_shape"]), p["synthetic_classes"])
        net.initialize(a._initializer(), ctx=[a.mx.cpu()])
        print(repr(a.weights_checksum(net)))
    """)
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(stage), "OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("kvstore", ["dist_sync", "dist_async"])
def test_parameter_server_cell_samples_phases_and_calibrates(tmp_path, mxnet_env, stage, kvstore):
    p = worker_params(framework="mxnet", workers=2, kvstore=kvstore, phase_sampling=5,
                      **({"cpuset": "0-1"} if TWO_CPUS else {}))
    outcome, run_dir = run_local(tmp_path, p)
    check_two_workers(outcome, run_dir, sync=kvstore == "dist_sync")  # (was test_workers' own MXNet test)
    roles = sorted(path.name for path in (run_dir / "workers").iterdir())
    assert roles == ["scheduler-0", "server-0", "worker-1"]
    order = ["forward", "backward", "exchange+update"]  # trainer.step: push, the server's update, pull
    # 12 steps, 2 of warm-up: timed steps 4 and 9 sampled, on every worker
    assert [r["step"] for r in check_phases(events_of(run_dir), order, every=5, check_throughput=False)] == [6, 11]
    assert [r["step"] for r in check_phases(events_of(run_dir / "workers" / "worker-1"), order, every=5)] == [6, 11]
    exchange = only(events_of(run_dir), "summary")["exchange"]
    assert exchange["kvstore"] == kvstore and exchange["seconds_median"] > 0
    calibrated = exchange["calibration"]
    points = calibrated["points"]
    assert [b for b, _ in points] == [4 * 1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024]
    assert all(seconds > 0 for _, seconds in points)
    assert calibrated["bandwidth_bytes_per_s"] is None or calibrated["bandwidth_bytes_per_s"] > 0
    assert (calibrated["pattern"], calibrated["transport"], calibrated["workers"],
            calibrated["overlaps_backward"]) == ("parameter server", "ps-lite (ZeroMQ, TCP)", 2, False)
    # the calibration's server optimizer (learning rate 0) gave way to the cell's: the weights moved
    assert exchange["weights_checksum"] != pytest.approx(initial_checksum(mxnet_env.python, stage, p), rel=1e-6)
    if kvstore == "dist_sync":
        assert only(events_of(run_dir), "summary")["replicas_identical"] is True


@pytest.mark.slow
def test_inference_mode_times_forward_batches(tmp_path, mxnet_env, stage):
    spec = write_spec(tmp_path / "run", **MX, mode="inference", iterations=12, epochs=None, optimizer=None,
                      lr=None, momentum=None, weight_decay=None, model="cifar_cnn", synthetic_shape=[3, 32, 32])
    proc = run_harness(mxnet_env.python, stage, spec, threads=1)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 12 and [s["epoch"] for s in steps[-2:]] == [2, 2]  # 128 test samples: 4 batches a pass
    assert not [e for e in events if e["type"] == "epoch"]
    summary = only(events, "summary")
    assert summary["accuracy"] is None and summary["inference_seconds"] > 0 and summary["throughput"] > 0


@pytest.mark.slow
def test_diverged_run_is_recorded_like_torch(tmp_path, mxnet_env, stage):
    spec = write_spec(tmp_path / "run", **MX, lr=1e8, epochs=3)
    proc = run_harness(mxnet_env.python, stage, spec, threads=1)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    assert len([e for e in events if e["type"] == "epoch"]) == 1
    summary = only(events, "summary")
    assert summary["diverged"] is True and summary["accuracy"] is None


@pytest.mark.slow
def test_gpu_asked_without_gpu_fails_the_run(tmp_path, mxnet_env, stage):
    spec = write_spec(tmp_path / "run", **MX, device="gpu", gpus=1)
    proc = run_harness(mxnet_env.python, stage, spec, threads=1)
    assert proc.returncode == 1
    assert "MXNet sees 0" in proc.stderr.strip().splitlines()[-1]
    probe = only(events_of(spec.parent), "probe")
    assert probe["in_force"]["device"] == "cpu"
    assert any(m.startswith("device: asked gpu, in force cpu") for m in probe["mismatches"])


@pytest.mark.slow
def test_onednn_off_reaches_the_cell_and_nothing_of_onednn_runs(tmp_path, mxnet_env):
    p = plan(dataset="synthetic", synthetic_train=256, synthetic_test=64, batch_size=32, epochs=1,
             warmup_steps=2, threads=1, onednn=False, onednn_check=True)
    env = cell_environment(p, Path("/stage"), {"PATH": "/bin", "MXNET_ONEDNN_ENABLED": "1"})
    assert env["MXNET_MKLDNN_ENABLED"] == "0"
    assert env["OPENBLAS_CORETYPE"] == "Haswell"
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == ("1", "1", "1")
    assert "MXNET_ONEDNN_ENABLED" not in env and "MXNET_CPU_WORKER_NTHREADS" not in env
    assert cell_environment({**p, "interop_threads": 2}, Path("/s"), {})["MXNET_CPU_WORKER_NTHREADS"] == "2"

    outcome, run_dir = run_cell(tmp_path, p)
    assert outcome.status == "ok", outcome.error_tail
    probe = only(events_of(run_dir), "probe")
    assert probe["in_force"]["onednn"] is False
    assert probe["in_force"]["env"]["MXNET_MKLDNN_ENABLED"] == "0"
    assert probe["onednn_primitives"] == 0
    assert probe["mismatches"] == []


@pytest.mark.slow
def test_lenet5_learns_real_fashion_mnist(tmp_path, mxnet_env, stage, fashion_mnist_root):
    spec = write_spec(tmp_path / "run", fashion_mnist_root, **MX, dataset="fashion-mnist",
                      synthetic_shape=None, synthetic_classes=None, synthetic_train=None, synthetic_test=None,
                      train_limit=6000, test_limit=1000, epochs=1, batch_size=64, lr=0.05)
    proc = run_harness(mxnet_env.python, stage, spec, threads=2)
    assert proc.returncode == 0, proc.stderr
    events = events_of(spec.parent)
    assert only(events, "data")["train_size"] == 6000
    assert only(events, "summary")["accuracy"] > 0.6


# --- host side -------------------------------------------------------------------------


REFUSED = [
    ({"layout": "nhwc"},
     'matrix.toml: [fixed] mxnet cannot run this cell: MXNet 1.9.1 has no NHWC convolution on the CPU '
     '("Only support NCW, NCHW and NCDHW layout"; with MKL-DNN the primitive cannot be created)'),
    ({"precision": "fp16"},
     'matrix.toml: [fixed] mxnet cannot run this cell: MXNet 1.9.1 has no fp16 on the CPU ("FP16 gemm on cpu '
     'not implemented!"; fp16 fully connected needs cuDNN)'),
    ({"precision": "tf32"},
     "matrix.toml: [fixed] mxnet cannot run this cell: TF32 is a feature of NVIDIA Ampere and later GPUs"),
    ({"precision": "bf16", "onednn": False},
     "matrix.toml: [fixed] mxnet cannot run this cell: MXNet 1.9.1's bf16 (AMP) runs only on MKL-DNN "
     'operators (without them: "Unknown type enum 12")'),
]


@pytest.mark.parametrize("fixed, message", REFUSED, ids=["nhwc", "fp16", "tf32", "bf16-no-onednn"])
def test_what_mxnet_cannot_do_is_refused_at_plan_time(fixed, message):
    with pytest.raises(MatrixError) as info:
        plan(**fixed)
    assert str(info.value) == message


def test_bf16_with_onednn_is_planned():
    assert plan(precision="bf16")["precision"] == "bf16"


def test_adapter_check_refuses_what_it_does_not_build():
    base = plan(dataset="synthetic")
    assert mxnet_gluon.check(base) is None
    assert "NCHW networks only" in mxnet_gluon.check({**base, "device": "gpu", "gpus": 1, "layout": "nhwc"})
    assert "at least" in (mxnet_gluon.check({**base, "model": "alexnet"}) or "") or \
        "larger input" in mxnet_gluon.check({**base, "model": "alexnet"})
    assert mxnet_gluon.check({**base, "model": "vgg"}).startswith("[params -> model] unknown model")
