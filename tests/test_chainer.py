"""Chainer 7.8.1 (study B's framework) as a matrun framework, on the CPU: the same networks as
the zoo, real harness runs in the real Chainer environment (built from its sdist under the
variant's build_constraints), the thread switch that really reaches numpy's OpenBLAS, the
training knobs, what is refused at plan time, and one cell in its Docker image."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from matrun.errors import InputError, MatrixError
from matrun.frameworks import get_framework, load_framework
from matrun.runner.environments.contexts import build_args_of, recipe_hash
from matrun.runner.executors.local import cell_environment
from matrun.runner.harness import models
from matrun.runner.harness.adapters import chainer as chainer_adapter
from matrun.runner.planning.matrix import parse_matrix
from test_harness import EVENT_KEYS, ZOO_PARITY, check_phases, events_of, only, write_spec
from test_local_executor import run_cell

ROOT = Path(__file__).resolve().parents[1]
CH = {"framework": "chainer", "env_id": "chainer-cpu-test", "onednn": None}
ZOO = [zoo[:3] for zoo in ZOO_PARITY]
CPUS = len(os.sched_getaffinity(0))


def plan(**fixed: Any) -> dict[str, Any]:
    """The planned cell of a chainer matrix (its onednn is null: Chainer has none)."""
    (cell,) = parse_matrix({"fixed": {"framework": "chainer", "phase_sampling": 10, **fixed}},
                           path=Path("matrix.toml")).cells
    return dict(cell.values)


@pytest.fixture(scope="session")
def chainer_env():
    """The real Chainer environment the local executor uses (built once, then reused)."""
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("chainer", "cpu")


def run_chainer(python: Path, stage: Path, spec: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """The harness with exactly the environment the local executor gives the cell."""
    p = json.loads(spec.read_text(encoding="utf-8"))["params"]
    env = cell_environment(p, stage)
    return subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(spec), "--out", str(spec.parent)],
                          capture_output=True, text=True, env=env, cwd=spec.parent, timeout=timeout)


def in_chainer(chainer_env: Any, stage: Path, script: str) -> Any:
    """Run ``script`` in the Chainer environment (one OpenBLAS thread); its last stdout line, as JSON."""
    proc = subprocess.run([str(chainer_env.python), "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(stage), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CONFIG = ('dict(threads=1, interop_threads="unset", onednn=None, device="cpu", conv_algo="heuristic", seed=0, '
          'layout="nchw", precision="fp32", optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=0.0)')


# --- in the Chainer environment ----------------------------------------------------------


@pytest.mark.slow
def test_every_network_has_the_zoo_parameter_count_and_shapes(chainer_env, stage):
    """One child link per layer-list entry, named after it; each one's output has the zoo's
    shape; the trainable parameters (BatchNorm's running statistics are persistent values, not
    parameters) add up to ``models.param_count``; BatchNorm keeps 0.9 of its running
    statistics with eps 1e-5; max-pool pads with -inf."""
    found = in_chainer(chainer_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import chainer as a
        a.configure({CONFIG})
        chainer, np = a.chainer, a.np
        found = {{}}
        for name, shape, classes in {ZOO!r}:
            net = a.build(name, tuple(shape), classes)
            x = np.zeros((1, *shape), np.float32)
            shapes = {{}}
            with chainer.using_config("train", False), chainer.no_backprop_mode():
                for unit, layer in zip(net.names, net.layers()):
                    x = layer(x).array
                    shapes[unit] = list(x.shape[1:])
            persistent = sorted({{p for link in net.links() for p in link._persistent}})
            found[name] = [a.parameter_count(net), net.names, shapes, persistent]
        bn = a.build("resnet18", (3, 224, 224), 1000).bn1
        pool = a.build("resnet18", (3, 224, 224), 1000).pool1
        with chainer.no_backprop_mode():
            pooled = pool(-np.ones((1, 1, 4, 4), np.float32)).array
        found["bn"] = [bn.decay, bn.eps]
        found["pool"] = [float(pooled.max()), list(pooled.shape)]
        print(json.dumps(found))
    """)
    for name, shape, classes in ZOO:
        count, names, shapes, _ = found[name]
        assert count == models.param_count(name, shape, classes), name
        assert names == [layer[1] for layer in models.MODELS[name]]  # one link per entry
        walked = {layer["name"]: list(layer["out"]) for layer in models.walk(name, shape, classes)}
        for unit, out in shapes.items():
            if unit in walked:
                assert out == walked[unit], (name, unit)
    assert found["resnet50"][0] == 25_557_032  # torchvision's ResNet-50
    assert found["resnet50"][2]["res5c"] == [2048, 7, 7]
    assert found["resnet18"][3] == ["N", "avg_mean", "avg_var"]  # BatchNorm's running statistics
    assert found["bn"] == [0.9, 1e-5]
    assert found["pool"] == [-1.0, [1, 1, 2, 2]]  # zero padding would give 0


@pytest.mark.slow
def test_harness_run_writes_every_event_type(tmp_path, chainer_env, stage):
    spec = write_spec(tmp_path / "run", **CH, epochs=2, threads=1, layer_profile=True, onednn_check=True)
    proc = run_chainer(chainer_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "header" and kinds[-2:] == ["summary", "end"]
    for kind, keys in EVENT_KEYS.items():
        assert kind in kinds, kind
        for event in (e for e in events if e["type"] == kind):
            assert keys <= set(event), (kind, keys - set(event))
    probe = only(events, "probe")
    assert probe["framework"] == "chainer" and probe["framework_version"] == "7.8.1"
    in_force = probe["in_force"]
    assert (in_force["threads"], in_force["onednn"], in_force["ideep_available"], in_force["layout"]) == (
        1, False, False, "nchw")
    assert in_force["blas"] == "openblas 0.3.20" and in_force["numpy_version"] == "1.23.5"
    assert probe["mismatches"] == []
    # nothing of oneDNN runs (the oneDNN check's verbose run counted none)
    assert probe.get("onednn_check_error") is None and probe["onednn_primitives"] == 0
    assert only(events, "model")["parameters"] == 61_706
    assert only(events, "model")["flops"] == models.forward_flops("lenet5", (1, 28, 28), 10)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 2 * 16 and all(s["seconds"] > 0 for s in steps)  # 512 samples in batches of 32
    assert [s["phase"] for s in steps[:6]] == ["warmup"] * 5 + ["timed"]
    # define-by-run, preloaded numpy slices: forward, backward and update each their own call
    check_phases(events, ["forward", "backward", "update"], sampled=[5 + 9, 5 + 19], gradient_element_bytes=None)
    layers = [e for e in events if e["type"] == "layer"]
    assert [e["name"] for e in layers] == [layer[1] for layer in models.LENET5]
    assert all(e["forward_seconds"] > 0 and e["backward_seconds"] > 0 for e in layers)
    summary = only(events, "summary")
    assert (summary["warmup_steps"], summary["timed_steps"]) == (5, 27 - 2)  # 2 sampled steps
    assert summary["gradient_bytes"] == 61_706 * 4  # float32 gradients
    assert summary["diverged"] is False and summary["throughput"] > 0
    assert summary["accuracy"] > 0.5  # the synthetic classes are learnable
    assert summary["input_pipeline"] == {"kind": "preloaded"} and summary["input_gradient_steps"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2, "unset"])
def test_threads_are_the_openblas_threads_in_force(tmp_path, chainer_env, stage, threads):
    """``threads`` reaches numpy's OpenBLAS (the variables, then threadpoolctl): threadpoolctl
    reads the count back and the process runs that many threads (OpenBLAS's n - 1 workers and
    the main thread); "unset" leaves OpenBLAS's default, one per CPU."""
    if isinstance(threads, int) and threads > CPUS:
        pytest.skip(f"{CPUS} CPU here")
    spec = write_spec(tmp_path / "run", **CH, epochs=None, iterations=4, warmup_steps=1, threads=threads)
    proc = run_chainer(chainer_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = only(events_of(spec.parent), "probe")
    expected = CPUS if threads == "unset" else threads
    assert probe["in_force"]["threads"] == expected and probe["in_force"]["process_threads"] == expected
    assert probe["mismatches"] == []
    libraries = [lib for lib in probe["libraries"] if lib.get("internal_api") == "openblas"]
    assert [lib["threads"] for lib in libraries] == [expected]
    variables = probe["in_force"]["env"]
    if threads == "unset":
        assert variables["OPENBLAS_NUM_THREADS"] is None and variables["OMP_NUM_THREADS"] is None
    else:
        assert variables["OPENBLAS_NUM_THREADS"] == variables["OMP_NUM_THREADS"] == str(threads)


@pytest.mark.slow
def test_inference_mode_times_forward_batches(tmp_path, chainer_env, stage):
    # batches of 8 (numpy's convolutions of the CIFAR CNN: the work scales with the batch)
    spec = write_spec(tmp_path / "run", **CH, mode="inference", iterations=12, epochs=None, optimizer=None,
                      lr=None, momentum=None, weight_decay=None, model="cifar_cnn", synthetic_shape=[3, 32, 32],
                      layer_profile=True, batch_size=8, synthetic_test=32)
    proc = run_chainer(chainer_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 12 and [s["epoch"] for s in steps[-2:]] == [2, 2]  # 32 test samples: 4 batches a pass
    assert not [e for e in events if e["type"] == "epoch"]
    layers = [e for e in events if e["type"] == "layer"]
    assert len(layers) == len(models.CIFAR_CNN) and all(e["backward_seconds"] is None for e in layers)
    summary = only(events, "summary")
    assert summary["accuracy"] is None and summary["inference_seconds"] > 0 and summary["throughput"] > 0


@pytest.mark.slow
def test_fp16_is_chainers_mixed16_and_learns(tmp_path, chainer_env, stage):
    """precision = "fp16": float16 weights and activations (``chainer.mixed16``), float32
    master weights and a dynamic loss scale; with Adam and weight decay the loss falls.  The
    gradients are the float16 weights': 2 bytes a parameter in ``gradient_bytes``; a sampled
    step's update holds the overflow check and the master weights' update."""
    # numpy computes float16 without a BLAS (slowly): batches of 8, 64 samples, 32 to evaluate
    spec = write_spec(tmp_path / "run", **CH, epochs=3, precision="fp16", optimizer="adam", lr=0.002,
                      weight_decay=5e-4, synthetic_train=64, synthetic_test=32, batch_size=8)
    proc = run_chainer(chainer_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert only(events, "probe")["in_force"]["dtype"] == "mixed16"
    epochs = [e for e in events if e["type"] == "epoch"]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] and not only(events, "summary")["diverged"]
    # 24 steps (8 an epoch), 5 warm-up
    check_phases(events, ["forward", "backward", "update"], sampled=[5 + 9], gradient_element_bytes=None)
    assert only(events, "summary")["gradient_bytes"] == 61_706 * 2


@pytest.mark.slow
def test_diverged_run_is_recorded_like_the_others(tmp_path, chainer_env, stage):
    spec = write_spec(tmp_path / "run", **CH, lr=1e8, epochs=3)
    proc = run_chainer(chainer_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert len([e for e in events if e["type"] == "epoch"]) == 1
    summary = only(events, "summary")
    assert summary["diverged"] is True and summary["accuracy"] is None
    assert any("stopped" in note for note in summary["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adadelta", "rmsprop"])
def test_each_optimizer_is_torchs_rule(chainer_env, stage, optimizer):
    """One update of each optimizer on a fixed gradient equals torch's formula, written out in
    numpy (coupled weight decay 0.1 included)."""
    found = in_chainer(chainer_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import chainer as a
        a.configure({CONFIG})
        chainer, np = a.chainer, a.np
        params = dict(optimizer={optimizer!r}, lr=0.1, momentum=0.9, weight_decay=0.1)
        link = chainer.Link()
        with link.init_scope():
            link.w = chainer.Parameter(np.array([1.0, -2.0, 3.0], np.float32))
        opt = a.make_optimizer(params)
        opt.setup(link)
        opt.add_hook(chainer.optimizer_hooks.WeightDecay(0.1))
        steps = []
        for g in ([0.5, 0.25, -1.0], [0.1, -0.3, 0.2]):
            link.w.grad = np.array(g, np.float32)
            opt.update()
            steps.append(link.w.array.tolist())
        print(json.dumps(steps))
    """)
    import math

    w = [1.0, -2.0, 3.0]
    m, v, acc, sq, buf = [0.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3, None
    expected = []
    for t, grad in enumerate(([0.5, 0.25, -1.0], [0.1, -0.3, 0.2]), start=1):
        g = [gi + 0.1 * wi for gi, wi in zip(grad, w)]  # coupled weight decay
        if optimizer == "sgd":  # torch: buf = 0.9 buf + g, w -= lr buf
            buf = g if buf is None else [0.9 * b + gi for b, gi in zip(buf, g)]
            w = [wi - 0.1 * b for wi, b in zip(w, buf)]
        elif optimizer == "adam":  # eps added to sqrt(v) before the bias correction (Chainer's, MXNet's form)
            m = [0.9 * mi + 0.1 * gi for mi, gi in zip(m, g)]
            v = [0.999 * vi + 0.001 * gi * gi for vi, gi in zip(v, g)]
            step = 0.1 * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            w = [wi - step * mi / (math.sqrt(vi) + 1e-8) for wi, mi, vi in zip(w, m, v)]
        elif optimizer == "adadelta":  # torch: rho 0.9, eps 1e-6, w -= lr delta
            sq = [0.9 * s + 0.1 * gi * gi for s, gi in zip(sq, g)]
            delta = [math.sqrt(a + 1e-6) / math.sqrt(s + 1e-6) * gi for a, s, gi in zip(acc, sq, g)]
            acc = [0.9 * a + 0.1 * d * d for a, d in zip(acc, delta)]
            w = [wi - 0.1 * d for wi, d in zip(w, delta)]
        else:  # torch's RMSprop: alpha 0.99, eps 1e-8 outside the square root
            sq = [0.99 * s + 0.01 * gi * gi for s, gi in zip(sq, g)]
            w = [wi - 0.1 * gi / (math.sqrt(s) + 1e-8) for wi, gi, s in zip(w, g, sq)]
        expected.append(w)
    assert [x for step in found for x in step] == pytest.approx([x for step in expected for x in step],
                                                                 rel=1e-5, abs=1e-6)


# --- the training knobs --------------------------------------------------------------------


@pytest.mark.slow
def test_first_layer_backward_full_computes_the_input_gradient(tmp_path, chainer_env, stage):
    """conv1's input gradient (a ``deconvolution_2d`` of Chainer's convolution backward) is
    computed only with "full": 3 training steps of LeNet-5 run 3 deconvolutions (conv2's)
    with "skip" and 6 with "full"; the layer profile's conv1 backward computes it with "full"
    only.  The harness counts the steps that produced it."""
    found = in_chainer(chainer_env, stage, f"""
        import json
        from matrun.runner.harness.adapters import chainer as a
        from matrun.runner.harness import datasets
        from matrun.runner.harness.events import EventLog
        a.configure({CONFIG})
        chainer, np = a.chainer, a.np

        class Count(chainer.FunctionHook):
            name = "count"
            def __init__(self):
                self.calls = 0
            def forward_preprocess(self, function, in_data):
                if type(function).__name__ == "Deconvolution2DFunction":
                    self.calls += 1

        params = dict({CONFIG}, dataset="synthetic", synthetic_shape=[1, 28, 28],
                      synthetic_classes=10, synthetic_train=96, synthetic_test=32, seed=0, train_limit=0,
                      test_limit=0, validation=0, batch_size=32, mode="train", model="lenet5")
        data = datasets.load(params, None)
        out = {{}}
        for mode in ("skip", "full"):
            params["first_layer_backward"] = mode
            net = a.build("lenet5", (1, 28, 28), 10)
            opt = a.make_optimizer(params)
            opt.setup(net)
            feed = a.Feed(params, data.train, data.shape)
            gradients = [0]
            with Count() as hook:
                a.train_epoch(net, opt, feed, [(0, 32), (32, 32), (64, 32)], epoch=0, seed=0,
                              record=lambda s: None, gradients=gradients if mode == "full" else None)
            ops = a.layer_ops(params, data, net)
            with Count() as profile:
                ops.ops[0].backward()
            out[mode] = [hook.calls, gradients[0], profile.calls]
        print(json.dumps(out))
    """)
    assert found == {"skip": [3, 0, 0], "full": [6, 3, 1]}


@pytest.mark.slow
def test_early_stopping_stops_when_validation_accuracy_stalls(tmp_path, chainer_env):
    """A learning rate of 1e-12 leaves the predictions (and so the validation accuracy) where
    they started: with patience 2, epochs 0, 1, 2 run and training stops, 7 epochs early."""
    p = plan(dataset="synthetic", synthetic_train=512, synthetic_test=128, batch_size=32, warmup_steps=2,
             threads=1, lr=1e-12, momentum=0.0, epochs=10, validation=64, early_stopping=2,
             onednn_check=False)  # (the check's own run: test_harness_run_writes_every_event_type)
    outcome, run_dir = run_cell(tmp_path, p)
    assert outcome.status == "ok", outcome.error_tail
    events = events_of(run_dir)
    assert (only(events, "data")["train_size"], only(events, "data")["validation_size"]) == (448, 64)
    epochs = [e for e in events if e["type"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    assert len({e["validation_accuracy"] for e in epochs}) == 1 and all(e["validation_seconds"] > 0 for e in epochs)
    assert sum(e["steps"] for e in epochs) == 3 * 14  # 448 samples in batches of 32
    summary = only(events, "summary")
    assert (summary["epochs_run"], summary["stopped_early"], summary["best_epoch"]) == (3, True, 0)


@pytest.mark.slow
def test_the_loader_feeds_the_steps(tmp_path, chainer_env):
    """loader_workers = 2: Chainer's MultiprocessIterator made every batch in two worker
    processes (each epoch's pool), fed the same permutation, so training equals the preloaded
    path's; loader_workers = 0: a SerialIterator in the training process."""
    # 16 batches an epoch, of 8 samples (numpy's work scales with the batch; the pool still gets
    # its 8 tasks a batch: multiprocessing's chunks of map_async); no oneDNN check's run (the
    # check: test_harness_run_writes_every_event_type)
    common = dict(dataset="synthetic", synthetic_train=128, synthetic_test=32, batch_size=8, warmup_steps=2,
                  threads=1, epochs=2, onednn_check=False)
    runs = {}
    for name, extra in {"preloaded": {}, "loader": {"input_pipeline": "loader", "loader_workers": 2},
                        "serial": {"input_pipeline": "loader"}}.items():
        (tmp_path / name).mkdir()
        outcome, run_dir = run_cell(tmp_path / name, plan(**common, **extra))
        assert outcome.status == "ok", outcome.error_tail
        runs[name] = events_of(run_dir)
    pipeline = only(runs["loader"], "summary")["input_pipeline"]
    steps = len([e for e in runs["loader"] if e["type"] == "step"])
    assert pipeline["kind"] == "loader" and pipeline["workers"] == 2 and pipeline["batches"] == steps == 32
    assert (pipeline["workers_seen"], pipeline["worker_pools"], pipeline["batches_in_process"]) == (2, 2, 0)
    assert "MultiprocessIterator" in pipeline["implementation"]
    serial = only(runs["serial"], "summary")["input_pipeline"]
    assert (serial["workers"], serial["workers_seen"], serial["batches_in_process"]) == (0, 0, 32)
    # the loader's fetch is inside the step's clock: its own phase, first; timed steps 9, 19, 29 sampled
    sampled = [2 + 9, 2 + 19, 2 + 29]
    for name in ("loader", "serial"):
        check_phases(runs[name], ["input", "forward", "backward", "update"], sampled, gradient_element_bytes=None)
    check_phases(runs["preloaded"], ["forward", "backward", "update"], sampled, gradient_element_bytes=None)
    assert only(runs["preloaded"], "summary")["input_pipeline"] == {"kind": "preloaded"}
    losses = {name: [e["train_loss"] for e in events if e["type"] == "epoch"] for name, events in runs.items()}
    assert losses["loader"] == pytest.approx(losses["preloaded"], rel=1e-5)
    assert losses["serial"] == pytest.approx(losses["preloaded"], rel=1e-5)


@pytest.mark.slow
def test_lenet5_learns_real_fashion_mnist(tmp_path, chainer_env, stage, fashion_mnist_root):
    spec = write_spec(tmp_path / "run", fashion_mnist_root, **CH, dataset="fashion-mnist", synthetic_shape=None,
                      synthetic_classes=None, synthetic_train=None, synthetic_test=None, train_limit=6000,
                      test_limit=1000, epochs=1, batch_size=64, lr=0.05, threads=2)
    proc = run_chainer(chainer_env.python, stage, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = events_of(spec.parent)
    assert only(events, "data")["train_size"] == 6000
    assert only(events, "summary")["accuracy"] > 0.6


# --- in the image ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_cell_runs_in_the_chainer_image(tmp_path, docker_client):
    """The image is built through matrun's own build path (the sdist under its build constraints,
    the probe and the variant's promises: OpenBLAS, no oneDNN) and runs a cell with no network."""
    from conftest import built_image
    from matrun.runner.executors.docker import DockerExecutor
    from test_workers import params, run_docker

    image = built_image(docker_client, "chainer", "cpu")
    labels = docker_client.images.get(image.tag).labels
    assert labels["org.matrun.build-arg.PIP_BUILD_CONSTRAINTS"] == "setuptools<81"
    assert labels["org.matrun.pin.chainer"] == "7.8.1" and labels["org.matrun.pin.setuptools"] == "65.5.0"
    outcome, run_dir, sweep = run_docker(DockerExecutor(docker_client), tmp_path,
                                         params(framework="chainer", threads=1))
    assert outcome.status == "ok", outcome.error_tail
    assert docker_client.containers.list(all=True, filters={"label": f"matrun.sweep={sweep}"}) == []
    events = events_of(run_dir)
    probe = only(events, "probe")
    assert probe["framework_version"] == "7.8.1" and probe["in_force"]["threads"] == 1
    assert probe["in_force"]["blas"] == "openblas 0.3.20" and probe["mismatches"] == []
    summary = only(events, "summary")
    assert summary["throughput"] > 0 and summary["accuracy"] is not None


# --- host side -------------------------------------------------------------------------


REFUSED = [
    ({"layout": "nhwc"},
     "matrix.toml: [fixed] chainer cannot run this cell: Chainer 7.8.1 computes in NCHW only on the CPU: its one "
     "channels-last layout (chainer.memory_layouts, experimental) is cuDNN's"),
    ({"precision": "bf16"},
     "matrix.toml: [fixed] chainer cannot run this cell: Chainer 7.8.1 has no bfloat16 (its CPU arrays are "
     "numpy's, which has no bfloat16 type)"),
    ({"precision": "tf32"},
     "matrix.toml: [fixed] chainer cannot run this cell: TF32 is a feature of NVIDIA Ampere and later GPUs"),
    ({"interop_threads": 2},
     "matrix.toml: [fixed] chainer cannot run this cell: Chainer runs one operator at a time in the Python thread; "
     "only numpy's OpenBLAS has a thread pool (threads): there is no inter-op pool to size"),
    ({"workers": 2},
     "matrix.toml: [fixed] chainer cannot run this cell: multi-worker Chainer is ChainerMN, which needs MPI "
     "(mpi4py and an MPI library) and is not part of this environment"),
    ({"nodes": 2},
     "matrix.toml: [fixed] chainer cannot run this cell: multi-node Chainer is ChainerMN, which needs MPI "
     "(mpi4py and an MPI library) and is not part of this environment"),
    ({"device": "gpu"},
     'matrix.toml: [fixed] variant "cpu" of chainer is a CPU build; a gpu cell needs one of: none'),
    ({"kvstore": "dist_sync"},
     "matrix.toml: [fixed] kvstore is the parameter-server choice of MXNet; chainer exchanges gradients "
     "synchronously (all-reduce): leave kvstore out"),
]


@pytest.mark.parametrize("fixed, message", REFUSED,
                         ids=["nhwc", "bf16", "tf32", "interop", "workers", "nodes", "gpu", "kvstore"])
def test_what_chainer_cannot_do_is_refused_at_plan_time(fixed, message):
    with pytest.raises(MatrixError) as info:
        plan(**fixed)
    assert str(info.value) == message


def test_onednn_does_not_apply_to_chainer_so_either_value_is_the_same_cell():
    """Chainer has no oneDNN (framework.toml onednn = false): the host nulls the parameter, as
    kvstore for a framework without parameter servers, so true (the default) and false plan the
    same cell and a cross-framework matrix needs no per-framework onednn."""
    cells = [parse_matrix({"fixed": {"framework": "chainer", "onednn": value}}, path=Path("matrix.toml")).cells[0]
             for value in (True, False)]
    assert [c.values["onednn"] for c in cells] == [None, None] and cells[0].identity == cells[1].identity
    (cell,) = parse_matrix({"fixed": {"framework": "chainer"}}, path=Path("matrix.toml")).cells
    assert cell.values["onednn"] is None and "onednn" not in cell.label


def test_what_chainer_can_do_is_planned():
    assert plan(precision="fp16")["precision"] == "fp16"  # chainer.mixed16 on numpy: slow, but real
    assert plan(threads=2)["threads"] == 2 and plan(threads="unset")["threads"] == "unset"
    assert plan(input_pipeline="loader", loader_workers=2)["loader_workers"] == 2
    assert plan(first_layer_backward="full", validation=64, early_stopping=2, dataset="synthetic",
                synthetic_train=512)["early_stopping"] == 2
    assert plan(mode="inference", layer_profile=True, iterations=8, warmup_steps=2)["mode"] == "inference"
    for optimizer in ("sgd", "adam", "adadelta", "rmsprop"):
        assert plan(optimizer=optimizer)["optimizer"] == optimizer


def test_adapter_check_refuses_what_it_cannot_run():
    base = plan(dataset="synthetic")
    assert chainer_adapter.check(base) is None
    assert chainer_adapter.check({**base, "model": "vgg"}).startswith("[params -> model] unknown model")
    assert chainer_adapter.check({**base, "model": "alexnet"}).startswith("[params -> synthetic_shape] alexnet needs")
    # a spec made by hand gets the plan-time refusals too (a bad spec, exit 2, instead of a run as something else)
    assert chainer_adapter.check({**base, "onednn": True}).startswith("[params -> onednn] Chainer 7.8.1 has no oneDNN")
    assert base["onednn"] is None
    assert chainer_adapter.check({**base, "layout": "nhwc"}).startswith("[params -> layout]")
    assert chainer_adapter.check({**base, "precision": "bf16"}).startswith("[params -> precision] bf16")
    assert chainer_adapter.check({**base, "precision": "tf32"}).startswith("[params -> precision] tf32")
    assert chainer_adapter.check({**base, "interop_threads": 2}).startswith("[params -> interop_threads]")
    assert chainer_adapter.check({**base, "workers": 2}).startswith("[params -> workers] multi-worker Chainer")
    assert chainer_adapter.check({**base, "device": "gpu", "gpus": 1}).startswith("[params -> device]")
    assert chainer_adapter.check({**base, "precision": "fp16"}) is None


def test_framework_default_presets_are_chainers_examples():
    mnist = plan(preset="framework-default")  # fashion-mnist: the mnist example
    assert (mnist["optimizer"], mnist["lr"], mnist["batch_size"], mnist["epochs"], mnist["eval_batch_size"]) == (
        "adam", 0.001, 100, 20, 100)
    assert mnist["momentum"] is None  # Adam: momentum does not apply
    cifar = plan(preset="framework-default", dataset="cifar10")
    assert (cifar["optimizer"], cifar["lr"], cifar["momentum"], cifar["weight_decay"], cifar["batch_size"],
            cifar["epochs"], cifar["eval_batch_size"]) == ("sgd", 0.05, 0.9, 0.0005, 64, 300, 64)


def test_the_threads_reach_openblas_and_the_hosts_chainer_variables_do_not():
    env = cell_environment(plan(threads=2), Path("/stage"), {"PATH": "/bin", "CHAINER_TYPE_CHECK": "0",
                                                             "CHAINER_USE_IDEEP": "always", "OMP_NUM_THREADS": "8"})
    assert (env["OPENBLAS_NUM_THREADS"], env["OMP_NUM_THREADS"]) == ("2", "2")
    assert not [k for k in env if k.startswith("CHAINER_")] and "MKL_NUM_THREADS" not in env
    unset = cell_environment(plan(threads="unset"), Path("/stage"), {"PATH": "/bin", "OMP_NUM_THREADS": "8"})
    assert "OMP_NUM_THREADS" not in unset and "OPENBLAS_NUM_THREADS" not in unset


def test_build_constraints_reach_the_venv_build_and_the_image_build():
    """The sdist's isolated build needs setuptools < 81: the local environment's pip install
    gets the constraint through PIP_CONSTRAINT (and its id hashes it), the image gets it as the
    build argument PIP_BUILD_CONSTRAINTS, which its Dockerfile declares, writes to a file and
    points PIP_CONSTRAINT at; a variant without build_constraints is hashed as before."""
    from matrun.runner.environments.venvs import EnvSpec, env_spec

    spec = env_spec("chainer", "cpu")
    assert spec.build_constraints == ("setuptools<81",)
    assert spec.env_id != EnvSpec(spec.framework, spec.variant, spec.requirements).env_id
    var = get_framework("chainer").variant("cpu")
    assert build_args_of(var) == {"PIP_BUILD_CONSTRAINTS": "setuptools<81"}
    assert build_args_of(get_framework("torch").variant("cpu")) == {}
    dockerfile = (ROOT / "images" / "chainer" / "Dockerfile.cpu").read_text(encoding="utf-8")
    assert 'ARG PIP_BUILD_CONSTRAINTS=""' in dockerfile
    assert "printf '%s\\n' $PIP_BUILD_CONSTRAINTS > /tmp/ctx/build-constraints.txt" in dockerfile
    assert "export PIP_CONSTRAINT=/tmp/ctx/build-constraints.txt" in dockerfile
    assert len(recipe_hash("chainer", "cpu")) == 64


@pytest.mark.slow
def test_the_environment_builds_without_a_cached_wheel(tmp_path, monkeypatch):
    """pip's cache off (as on a fresh machine: no chainer wheel built before), the sdist builds
    in its isolated environment held to setuptools < 81, and chainer imports."""
    from matrun.runner.environments.venvs import ensure_env

    monkeypatch.setenv("MATRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    env = ensure_env("chainer", "cpu")
    assert (env.path / "build-constraints.txt").read_text(encoding="utf-8") == "setuptools<81\n"
    proc = subprocess.run([str(env.python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True)
    frozen = set(proc.stdout.split())
    assert {"chainer==7.8.1", "numpy==1.23.5", "setuptools==65.5.0", "threadpoolctl==3.8.0"} <= frozen


@pytest.mark.parametrize("value, message", [
    ('"setuptools<81"', "build_constraints must be a list of strings"),
    ('["setuptools"]', "build_constraints are pip constraints, each a project name and its versions"),
    ('["setuptools < 81"]', "build_constraints are pip constraints, each a project name and its versions"),
    ('["--no-build-isolation"]', "build_constraints are pip constraints, each a project name and its versions"),
])
def test_build_constraints_are_read_strictly(tmp_path, value, message):
    import shutil

    folder = tmp_path / "chainer"
    shutil.copytree(ROOT / "images" / "chainer", folder)
    toml = folder / "framework.toml"
    text = toml.read_text(encoding="utf-8")
    assert 'build_constraints = ["setuptools<81"]' in text
    toml.write_text(text.replace('build_constraints = ["setuptools<81"]', f"build_constraints = {value}"),
                    encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_framework(folder)
    assert str(err.value).startswith("images/chainer/framework.toml [variants.cpu]: ") and message in str(err.value)
