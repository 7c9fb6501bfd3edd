"""JAX 0.10 (Flax + optax) as a matrun framework: the same networks as the zoo, real harness
runs in the real JAX environment, the switches that really reach XLA (threads through the
CPU affinity, measured by the pool XLA starts), what is refused at plan time, and multi-worker
cells over jax.distributed with gloo collectives."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from matrun.errors import MatrixError
from matrun.runner.executors.local import cell_environment
from matrun.runner.harness import models, phases
from matrun.runner.harness.adapters import jax as jax_adapter
from matrun.runner.planning.matrix import parse_matrix
from test_harness import EVENT_KEYS, ZOO_PARITY, check_phases, events_of, only, write_spec
from test_workers import CPUSET, TWO_CPUS, check_two_workers, params, run_local

JAX = {"framework": "jax", "env_id": "jax-cpu-test", "layout": "nhwc"}
ZOO = [zoo[:3] for zoo in ZOO_PARITY]


def plan(**fixed: Any) -> dict[str, Any]:
    (cell,) = parse_matrix({"fixed": {"framework": "jax", "phase_sampling": 10, **fixed}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


def run_jax(python: Path, stage: Path, spec: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """The harness with exactly the environment the local executor gives the cell."""
    p = json.loads(spec.read_text(encoding="utf-8"))["params"]
    env = cell_environment(p, stage)
    return subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(spec), "--out", str(spec.parent)],
                          capture_output=True, text=True, env=env, cwd=spec.parent, timeout=timeout)


def in_jax(jax_env: Any, stage: Path, script: str, *, env: dict[str, str] | None = None) -> Any:
    """Run ``script`` in the JAX environment; its last stdout line, parsed as JSON."""
    proc = subprocess.run([str(jax_env.python), "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(stage), "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CONFIG = ('dict(threads=2, interop_threads="unset", onednn=True, device="cpu", conv_algo="heuristic", seed=0, '
          'layout="nhwc", precision="fp32", optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=0.0, gpus=None, '
          'cpuset="")')


@pytest.fixture(scope="session")
def jax_env():
    """The real JAX environment the local executor uses (built once, then reused)."""
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("jax", "cpu")


# --- in the JAX environment -------------------------------------------------------------


@pytest.mark.slow
def test_every_network_has_the_zoo_parameter_count_and_shapes(jax_env, stage):
    """Each unit's output has the zoo's (C, H, W) in both layouts, and the trainable parameters
    (Flax's ``params`` collection: BatchNorm's running statistics are not among them) add up
    to ``models.param_count``."""
    found = in_jax(jax_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import jax as a
        a.configure({CONFIG})
        jax, jnp = a.jax, a.jnp
        found = {{}}
        for layout in ("nchw", "nhwc"):
            for name, shape, classes in {ZOO!r}:
                net = a.build(name, tuple(shape), classes, layout)
                variables = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0)))
                x = jax.ShapeDtypeStruct(net.input_shape(2), jnp.float32)
                shapes = {{}}
                for unit_name, unit in net.units():
                    sub = {{k: v[unit_name] for k, v in variables.items() if unit_name in v}}
                    x = jax.eval_shape(lambda s, i: unit.apply(s, i, train=False), sub, x)
                    out = tuple(x.shape[1:])
                    if len(out) == 3 and layout == "nhwc":
                        out = (out[2], out[0], out[1])
                    shapes[unit_name] = list(out)
                found[f"{{layout}} {{name}}"] = [a.parameter_count(variables["params"]), shapes]
        print(json.dumps(found))
    """)
    for layout in ("nchw", "nhwc"):
        for name, shape, classes in ZOO:
            count, shapes = found[f"{layout} {name}"]
            assert count == models.param_count(name, shape, classes), (layout, name)
            walked = {layer["name"]: list(layer["out"]) for layer in models.walk(name, shape, classes)}
            assert [n for n in shapes] == [layer[1] for layer in models.MODELS[name]]  # one unit per entry
            for unit, out in shapes.items():
                if unit in walked:
                    assert out == walked[unit], (layout, name, unit)
    assert found["nhwc resnet50"][0] == 25_557_032  # torchvision's ResNet-50
    assert found["nchw resnet50"][1]["res5c"] == [2048, 7, 7]


@pytest.mark.slow
def test_the_mesh_step_over_two_devices_equals_the_one_device_step(jax_env, stage):
    """The data-parallel step of gpus > 1 and of multi-worker cells (shard_map + psum), over
    two CPU devices: each takes every other sample of the batch, an uneven batch (37) is padded
    with weight-0 copies, the gradients are summed; losses, counts and weights equal one
    device's."""
    found = in_jax(jax_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import jax as a
        params = {CONFIG}
        a.configure(params)
        jax, np = a.jax, a.np
        from jax.sharding import Mesh
        rng = np.random.default_rng(1)
        x = rng.standard_normal((64, 28, 28, 1)).astype(np.float32)
        y = rng.integers(0, 10, 64).astype(np.int32)
        out = []
        for devices in (jax.devices()[:1], jax.devices()[:2]):
            place = a.Placement(devices, Mesh(np.array(devices), ("data",)) if len(devices) > 1 else None)
            net = a.build("lenet5", (1, 28, 28), 10, "nhwc")
            trainer = a.Trainer(net, params, a.init_state(net, params, (1, 28, 28), place), place,
                                input_gradient=False)
            sums = []
            for xb, yb in ((x, y), (x, y), (x[:37], y[:37])):
                trainer.prepare([len(yb)])
                loss, correct, _ = trainer.run(len(yb), *trainer.batch(xb, yb, len(yb)))
                sums.append([float(a._local_value(loss)), int(a._local_value(correct))])
            out.append([len(devices), sums, a.weights_checksum(trainer.local_state())])
        print(json.dumps(out))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    (one, one_sums, one_weights), (two, two_sums, two_weights) = found
    assert (one, two) == (1, 2)
    assert [s[0] for s in two_sums] == pytest.approx([s[0] for s in one_sums], rel=1e-5)
    assert [s[1] for s in two_sums] == [s[1] for s in one_sums]
    assert two_weights == pytest.approx(one_weights, rel=1e-6)


@pytest.mark.slow
def test_the_input_gradient_adds_the_first_convolutions_backward_data_pass(jax_env, stage):
    """first_layer_backward = "full": XLA drops a gradient nobody reads, so the step consumes
    the input's gradient; the optimised program then holds one convolution more (conv1's
    backward-data pass) than with "skip"."""
    found = in_jax(jax_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import jax as a
        params = {CONFIG}
        a.configure(params)
        np = a.np
        counts = {{}}
        for full in (False, True):
            place = a.placement(params)
            net = a.build("lenet5", (1, 28, 28), 10, "nhwc")
            trainer = a.Trainer(net, params, a.init_state(net, params, (1, 28, 28), place), place, input_gradient=full)
            x, y, w = trainer.batch(np.zeros((8, 28, 28, 1), np.float32), np.zeros(8, np.int32), 8)
            text = trainer._fn.lower(trainer._state_arg(), x, y, w, trainer._index(0)).compile().as_text()
            counts[str(full)] = text.count(" convolution(")
        print(json.dumps(counts))
    """)
    assert found["True"] == found["False"] + 1, found


@pytest.mark.slow
def test_harness_run_writes_every_event_type(tmp_path, jax_env, stage):
    spec = write_spec(tmp_path / "run", **JAX, epochs=2, threads=1, layer_profile=True, onednn_check=True)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    for record in events:
        assert EVENT_KEYS[record["type"]] <= set(record), record["type"]
    probe = only(events, "probe")
    assert probe["framework"] == "jax" and probe["framework_version"] == "0.10.2"
    assert probe["in_force"]["backend"] == "cpu" and probe["in_force"]["jaxlib_version"] == "0.10.2"
    assert probe["mismatches"] == []
    # XLA's dot products ran oneDNN's gemm (the only oneDNN it uses): the check counted them
    assert probe["onednn_primitives"] > 0 and set(probe["onednn_primitive_kinds"]) == {"gemm_api"}
    assert only(events, "model")["parameters"] == 61_706
    layers = [e for e in events if e["type"] == "layer"]
    assert [e["name"] for e in layers] == [layer[1] for layer in models.LENET5]
    assert all(e["forward_seconds"] > 0 for e in layers) and layers[0]["backward_seconds"] > 0
    summary = only(events, "summary")
    assert any("unfused" in note for note in summary["notes"])
    assert summary["timed_steps"] == 2 * 16 - 5 - 2 and summary["accuracy"] is not None  # 2 sampled
    # preloaded batches are on the device before the clock starts: the one jitted program is the step
    check_phases(events, ["forward+backward+update"], [5 + 9, 5 + 19])


@pytest.mark.slow
def test_a_loaders_step_times_its_fetch_and_copy_apart_from_the_jitted_step(tmp_path, jax_env, stage):
    """input_pipeline = "loader": the fetch (numpy conversion in a loader thread) and the
    device_put are inside the step's clock and marked apart; the jitted step stays one fused
    phase.  22 steps over two epochs (16 + 6): the sampling counts timed steps across them."""
    spec = write_spec(tmp_path / "run", **JAX, epochs=None, iterations=22, warmup_steps=2, threads=1,
                      input_pipeline="loader", loader_workers=1)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert [e["steps"] for e in events if e["type"] == "epoch"] == [16, 6]
    check_phases(events, ["input", "h2d", "forward+backward+update"], [2 + 9, 2 + 19])
    assert only(events, "summary")["input_pipeline"]["kind"] == "loader"


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2, "unset"])
def test_threads_reach_xla_through_the_cpu_affinity(tmp_path, jax_env, stage, threads):
    """XLA sizes its CPU pool (tf_XLAEigen threads) from the affinity: the adapter narrows it to
    ``threads`` CPUs before JAX starts, and the probe counts the pool's threads."""
    cpus = len(os.sched_getaffinity(0))
    if isinstance(threads, int) and threads > cpus:
        pytest.skip(f"{cpus} CPU here")
    spec = write_spec(tmp_path / "run", **JAX, epochs=1, iterations=8, warmup_steps=2, threads=threads)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_force = only(events_of(spec.parent), "probe")["in_force"]
    expected = cpus if threads == "unset" else threads
    assert in_force["threads"] == expected and in_force["thread_census"]["tf_XLAEigen"] == expected
    assert len(in_force["affinity"]) == expected and in_force["affinity_narrowed"] == (expected < cpus)


@pytest.mark.slow
def test_a_cpuset_is_checked_against_the_cells_own_cpus(tmp_path, jax_env, stage):
    if not TWO_CPUS:
        pytest.skip("needs CPUs 0 and 1")
    spec = write_spec(tmp_path / "run", **JAX, iterations=4, epochs=None, warmup_steps=1, threads=1, cpuset="0-1")
    p = json.loads(spec.read_text())["params"]
    env = cell_environment(p, stage)
    proc = subprocess.run(["taskset", "-c", "0-1", str(jax_env.python), "-m", "matrun.runner.harness", "--spec",
                           str(spec), "--out", str(spec.parent)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = only(events_of(spec.parent), "probe")
    assert probe["mismatches"] == [] and probe["in_force"]["affinity"] == [0]


@pytest.mark.slow
def test_inference_mode_times_forward_batches(tmp_path, jax_env, stage):
    # the training keys null, as the host's plan leaves them for an inference cell
    spec = write_spec(tmp_path / "run", **JAX, mode="inference", epochs=None, iterations=12, batch_size=16,
                      layer_profile=True, optimizer=None, lr=None, momentum=None, weight_decay=None)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert len([e for e in events if e["type"] == "step"]) == 12
    assert all(e["backward_seconds"] is None for e in events if e["type"] == "layer")
    assert only(events, "summary")["inference_seconds"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("precision, optimizer", [("bf16", "adam"), ("fp16", "rmsprop")])
def test_mixed_precision_with_weight_decay_learns(tmp_path, jax_env, stage, precision, optimizer):
    spec = write_spec(tmp_path / "run", **JAX, epochs=3, precision=precision, optimizer=optimizer, lr=0.002,
                      weight_decay=5e-4)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    epochs = [e for e in events_of(spec.parent) if e["type"] == "epoch"]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] and not only(events_of(spec.parent), "summary")["diverged"]


@pytest.mark.slow
def test_diverged_run_is_recorded_like_the_others(tmp_path, jax_env, stage):
    spec = write_spec(tmp_path / "run", **JAX, epochs=3, lr=1e12, optimizer="sgd")
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = only(events_of(spec.parent), "summary")
    assert summary["diverged"] is True and any("stopped" in n for n in summary["notes"])


@pytest.mark.slow
def test_gpu_asked_without_gpu_fails_the_run(tmp_path, jax_env, stage):
    spec = write_spec(tmp_path / "run", **JAX, device="gpu", gpus=1)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode != 0
    assert "device 'gpu' was asked but JAX sees no GPU" in proc.stderr


@pytest.mark.slow
def test_lenet5_learns_real_fashion_mnist(tmp_path, jax_env, stage, fashion_mnist_root):
    spec = write_spec(tmp_path / "run", fashion_mnist_root, **JAX, dataset="fashion-mnist", synthetic_shape=None,
                      synthetic_classes=None, synthetic_train=None, synthetic_test=None, train_limit=6000,
                      test_limit=1000, epochs=1, batch_size=64, lr=0.05, threads=2)
    proc = run_jax(jax_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert only(events, "data")["train_size"] == 6000
    assert only(events, "summary")["accuracy"] > 0.6


@pytest.mark.slow
def test_two_workers_over_jax_distributed_and_gloo(tmp_path, jax_env):
    """Two processes, one CPU device each, a mesh across them: the gradients are all-reduced
    (gloo), the replicas end with equal weights, and the exchange is measured."""
    outcome, run_dir = run_local(tmp_path, params(framework="jax", layout="nhwc", workers=2, **CPUSET))
    s = check_two_workers(outcome, run_dir)
    assert s["exchange"]["backend"] == "gloo" and "all-reduce" in s["exchange"]["method"]
    assert s["exchange"]["no_sync_pass_seconds_median"] > 0
    # the psum runs inside the jitted mesh step: the exchange is fused with the rest (12 steps, 2 warm-up)
    check_phases(events_of(run_dir), ["forward+backward+exchange+update"], [2 + 9])
    # before training, every worker timed the step's psum (gloo's ring) over the calibration sizes
    for calibrated in (s["exchange"]["calibration"], s["per_worker"][1]["exchange"]["calibration"]):
        sizes = [b for b, _ in calibrated["points"]]
        assert len(sizes) == 4 and sizes == sorted(set(sizes)) == list(phases.CALIBRATION_BYTES)
        assert all(seconds > 0 for _, seconds in calibrated["points"])
        assert calibrated["bandwidth_bytes_per_s"] is None or calibrated["bandwidth_bytes_per_s"] > 0
        assert calibrated["latency_s"] is None or calibrated["latency_s"] >= 0
        assert (calibrated["pattern"], calibrated["transport"], calibrated["workers"],
                calibrated["overlaps_backward"]) == ("ring all-reduce", "gloo", 2, False)


# --- host side -------------------------------------------------------------------------


REFUSED = [
    ({"onednn": False}, "jax cannot run this cell: XLA's CPU backend has no switch that turns oneDNN off"),
    ({"interop_threads": 2}, "jax cannot run this cell: XLA's CPU runtime has one thread pool"),
    ({"precision": "tf32"}, "jax cannot run this cell: TF32 is a feature of NVIDIA Ampere and later GPUs"),
    ({"device": "gpu"}, 'variant "cpu" of jax is a CPU build; a gpu cell needs one of: cuda, cuda-pypi'),
    ({"dataset": "cifar10", "preset": "framework-default"},
     "preset \"framework-default\" has no jax example for dataset 'cifar10' (it has: mnist, fashion-mnist)"),
]


@pytest.mark.parametrize("fixed, message", REFUSED, ids=["onednn-off", "interop", "tf32", "gpu-on-cpu", "cifar-preset"])
def test_what_jax_cannot_do_is_refused_at_plan_time(fixed, message):
    with pytest.raises(MatrixError) as info:
        plan(**fixed)
    assert message in str(info.value)


def test_what_jax_can_do_is_planned():
    assert plan(precision="fp16")["precision"] == "fp16"  # XLA runs f16 on the CPU: measured, not refused
    assert plan(precision="bf16", layout="nchw")["layout"] == "nchw"
    assert plan(workers=2, threads=2)["workers"] == 2
    assert plan(interop_threads="unset")["interop_threads"] == "unset"


def test_adapter_check_refuses_what_it_cannot_build():
    base = plan(dataset="synthetic")
    assert jax_adapter.check(base) is None
    assert jax_adapter.check({**base, "model": "vgg"}).startswith("[params -> model] unknown model")
    assert jax_adapter.check({**base, "model": "alexnet"}).startswith("[params -> synthetic_shape] alexnet needs")
    # a spec made by hand gets the plan-time refusals too (a bad spec, exit 2, instead of a crash)
    assert jax_adapter.check({**base, "onednn": False}).startswith("[params -> onednn]")
    assert jax_adapter.check({**base, "interop_threads": 2}).startswith("[params -> interop_threads]")
    assert jax_adapter.check({**base, "precision": "tf32"}).startswith("[params -> precision] TF32")


def test_framework_default_preset_is_the_flax_example():
    cell = plan(preset="framework-default")
    assert (cell["optimizer"], cell["lr"], cell["momentum"], cell["batch_size"], cell["epochs"]) == (
        "sgd", 0.1, 0.9, 128, 10)


def test_a_worker_plan_hands_jax_its_coordinator():
    from matrun.frameworks import get_framework

    env = get_framework("jax").workers.environment("worker", {
        "rank": 1, "local_rank": 1, "world": 2, "local_world": 2, "node_rank": 0, "addr": "127.0.0.1",
        "iface": "lo", "rendezvous_addr": "127.0.0.1", "rendezvous_port": 29500, "port": 29500, "servers": 0,
        "worker_addresses": ["127.0.0.1:29500"]})
    assert env == {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:29500", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1",
                   "GLOO_SOCKET_IFNAME": "lo"}
