"""The in-cell harness: data loaders in-process, and real runs of the harness in the torch venv.

The harness must work where nothing of matrun's host side is installed, so every run here
goes through a real subprocess of the torch environment's Python, with ``PYTHONPATH``
pointing at a stage directory that holds only the installed ``matrun`` package root and
its ``runner`` folder (the same thing the host launchers do).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import pytest

from matrun.runner import harness
from matrun.runner.harness.cell import load_spec
from matrun.runner.harness.errors import DataError, SpecError
from matrun.runner.harness import datasets as data
from matrun.runner.harness.adapters import known_frameworks
from matrun.runner.harness.events import EventLog, throughput

from bundle_factory import DEFAULT_PARAMS

HARNESS_DIR = Path(harness.__file__).parent

# The factory's defaults, on small synthetic data: a harness run of a few seconds.
BASE_PARAMS: dict[str, Any] = {
    **DEFAULT_PARAMS, "dataset": "synthetic", "synthetic_train": 512, "synthetic_test": 128,
    "epochs": 3, "batch_size": 32, "eval_batch_size": 100, "lr": 0.05, "warmup_steps": 5,
    "gpus": None, "layout": "nchw", "precision": "fp32", "conv_algo": "heuristic",
    "layer_profile": False, "preset": "none", "onednn_check": False,
    "phase_sampling": 10,  # (the default is 20) short test runs sample every 10th timed step
}

# docs/BUNDLE.md, events.jsonl: the keys of each record type
EVENT_KEYS = {
    "header": {"schema_version", "harness_version", "t"},
    "probe": {"framework", "framework_version", "python", "in_force", "build", "libraries", "mismatches",
              "onednn_primitives", "onednn_primitive_kinds", "onednn_verbose_sample", "onednn_check_seconds"},
    "data": {"dataset", "train_size", "test_size", "shape", "classes", "load_seconds"},
    "model": {"name", "parameters", "flops"},
    "step": {"epoch", "step", "phase", "seconds", "images"},
    "phases": {"step", "seconds", "phases"},
    "epoch": {"epoch", "steps", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
              "epoch_seconds", "test_seconds"},
    "layer": {"name", "kind", "index", "forward_seconds", "backward_seconds", "repeats", "images", "params",
              "flops"},
    "summary": {"train_seconds", "test_seconds", "accuracy", "throughput", "time_to_first_step",
                "timed_steps", "warmup_steps", "diverged", "inference_seconds", "peak_device_memory_bytes"},
    "end": {"t"},
}
IN_FORCE_KEYS = {"threads", "interop_threads", "affinity", "onednn", "device"}


# --- helpers ---------------------------------------------------------------------------


def write_spec(run_dir: Path, data_dir: Path | str = "/nonexistent", **params: Any) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {"schema_version": 1, "sweep": "test", "cell_id": "0123456789abcdef", "repeat": 0,
            "attempt": 1, "env_id": "torch-cpu-test", "data_dir": str(data_dir),
            "params": {**BASE_PARAMS, **params}}
    path = run_dir / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def run_harness(python: Path, stage: Path, spec: Path, *, threads: Any = 1) -> subprocess.CompletedProcess[str]:
    """Launch the harness as the host does: thread variables set, PYTHONPATH at the stage."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(stage)
    if threads != "unset":
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(threads)
    return subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(spec),
                           "--out", str(spec.parent)], capture_output=True, text=True, env=env,
                          cwd=spec.parent, timeout=120)


def events_of(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def only(events: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == type_]
    assert len(found) == 1, f"{len(found)} {type_} records"
    return found[0]

def check_phases(events: list[dict[str, Any]], order: list[str], sampled: list[int] | None = None, *,
                 every: int = 10, check_throughput: bool = True, gradient_element_bytes: int | None = 4
                 ) -> list[dict[str, Any]]:
    """The sampled steps of one process's events (every ``every``-th timed step; the tests run
    at 10, the default is 20): exactly ``sampled`` when given; one ``phases`` record each with
    ``order``'s names (fused phases under one name joined by ``+``), all > 0 and within the
    step's seconds; the summary's ``phases`` computed from them; ``timed_steps`` and (unless
    ``check_throughput`` is False: a multi-worker rank 0's throughput is the cell's) the
    throughput over the other timed steps; ``gradient_bytes`` = the model's parameters x
    ``gradient_element_bytes`` (None: not checked).  Returns the phase records."""
    steps = [e for e in events if e["type"] == "step"]
    summary = only(events, "summary")
    warmup = summary["warmup_steps"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert [s["phase"] for s in steps[:warmup]] == ["warmup"] * warmup
    expected = [i for i in range(warmup, len(steps)) if (i - warmup) % every == every - 1]
    assert expected, "the run is too short to sample a step"
    assert [s["step"] for s in steps if s["phase"] == "sampled"] == expected
    if sampled is not None:
        assert expected == sampled
    records = [e for e in events if e["type"] == "phases"]
    assert [r["step"] for r in records] == expected
    for record in records:
        assert list(record["phases"]) == order
        assert all(v > 0 for v in record["phases"].values()), record
        assert record["seconds"] == steps[record["step"]]["seconds"] >= sum(record["phases"].values())
    timed = [s for s in steps if s["phase"] == "timed"]
    assert summary["timed_steps"] == len(timed) == len(steps) - warmup - len(expected)
    if check_throughput:
        assert summary["throughput"] == pytest.approx(statistics.median(s["images"] / s["seconds"] for s in timed))
    model = summary["phases"]
    assert (model["every"], model["sampled_steps"], model["order"]) == (every, len(expected), order)
    assert model["fused"] == [name for name in order if "+" in name]  # never split by guesswork
    for name in order:
        assert model["median"][name] == pytest.approx(statistics.median(r["phases"][name] for r in records))
    assert model["unsampled_step_seconds_median"] == pytest.approx(statistics.median(s["seconds"] for s in timed))
    if gradient_element_bytes is not None:
        assert summary["gradient_bytes"] == only(events, "model")["parameters"] * gradient_element_bytes
    return records


def write_idx(path: Path, magic: int, dims: tuple[int, ...], payload: bytes, *, gz: bool) -> Path:
    """An IDX file in the official format: magic, big-endian uint32 dimensions, bytes."""
    raw = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + payload
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def make_idx_dataset(root: Path, *, n_train: int = 6, n_test: int = 4, side: int = 4, gz: bool) -> Path:
    folder = root / "fashion-mnist"
    folder.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        pixels = bytes((i * 7 + (prefix == "t10k")) % 256 for i in range(n * side * side))
        write_idx(folder / f"{prefix}-images-idx3-ubyte", 0x803, (n, side, side), pixels, gz=gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", 0x801, (n,), bytes(i % 10 for i in range(n)), gz=gz)
    return folder


# --- data, in process ------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_idx_dataset_loads_and_limits(tmp_path: Path, gz: bool) -> None:
    make_idx_dataset(tmp_path, gz=gz)
    params = {**BASE_PARAMS, "dataset": "fashion-mnist"}
    ds = data.load(params, tmp_path)
    assert (ds.name, ds.shape, ds.classes) == ("fashion-mnist", (1, 4, 4), 10)
    assert (ds.train.count, ds.test.count) == (6, 4)
    assert ds.train.images == bytes(i * 7 % 256 for i in range(6 * 16))
    assert list(ds.train.labels) == [0, 1, 2, 3, 4, 5]

    limited = data.load({**params, "train_limit": 2, "test_limit": 3}, tmp_path)
    assert (limited.train.count, limited.test.count) == (2, 3)
    assert limited.train.images == ds.train.images[:32]
    assert list(limited.test.labels) == [0, 1, 2]


def test_idx_bad_magic_number(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x-images-idx3-ubyte", 0x802, (1, 2, 2), bytes(4), gz=False)
    with pytest.raises(DataError) as err:
        data.read_idx(path, magic=data.IDX_IMAGES_MAGIC)
    assert str(err.value) == (f"{path}: bad magic number 0x00000802, expected 0x00000803 "
                              "(an IDX file of unsigned bytes with 3 dimension(s))")


def test_idx_truncated_raw_file(tmp_path: Path) -> None:
    make_idx_dataset(tmp_path, gz=False)
    path = tmp_path / "fashion-mnist" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError) as err:
        data.load({**BASE_PARAMS, "dataset": "fashion-mnist"}, tmp_path)
    assert str(err.value) == f"{path}: truncated: dimensions 6×4×4 need 96 bytes of data, the file has 95"


def test_idx_truncated_gzip_stream(tmp_path: Path) -> None:
    make_idx_dataset(tmp_path, gz=True)
    path = tmp_path / "fashion-mnist" / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"cannot read: .*\(truncated or not gzip\?\)"):
        data.load({**BASE_PARAMS, "dataset": "fashion-mnist"}, tmp_path)


def test_idx_label_count_must_match_images(tmp_path: Path) -> None:
    folder = make_idx_dataset(tmp_path, gz=False)
    write_idx(folder / "t10k-labels-idx1-ubyte", 0x801, (3,), bytes(3), gz=False)
    with pytest.raises(DataError, match="holds 4 images but .* holds 3 labels"):
        data.load({**BASE_PARAMS, "dataset": "fashion-mnist"}, tmp_path)


def test_missing_dataset_names_path_and_package(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        data.load({**BASE_PARAMS, "dataset": "mnist"}, tmp_path)
    message = str(err.value)
    assert str(tmp_path / "mnist") in message  # the wording of the hint is data.py's


def test_synthetic_is_deterministic_and_class_dependent() -> None:
    one = data.synthetic((1, 16, 16), classes=3, train=300, test=40, seed=7)
    two = data.synthetic((1, 16, 16), classes=3, train=300, test=40, seed=7)
    other = data.synthetic((1, 16, 16), classes=3, train=300, test=40, seed=8)
    assert one == two
    assert one.train.images != other.train.images
    assert len(one.train.images) == 300 * 256 and one.train.count == 300
    assert set(one.train.labels) == {0, 1, 2}
    # the test split does not depend on the size of the training split
    assert data.synthetic((1, 16, 16), classes=3, train=10, test=40, seed=7).test == one.test
    # each class has its own mean image: the per-class means differ by far more than noise
    means = []
    for label in range(3):
        rows = [one.train.images[i * 256:(i + 1) * 256] for i, y in enumerate(one.train.labels) if y == label]
        means.append([sum(r[p] for r in rows) / len(rows) for p in range(256)])
    gap = sum(abs(a - b) for a, b in zip(means[0], means[1])) / 256
    assert gap > 10


def test_synthetic_honours_limits() -> None:
    ds = data.load({**BASE_PARAMS, "train_limit": 100, "test_limit": 10}, Path("/nonexistent"))
    assert (ds.train.count, ds.test.count, ds.shape) == (100, 10, (1, 28, 28))


# --- events and spec, in process -------------------------------------------------------


def test_event_log_buffers_steps_until_the_epoch(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path, warmup_steps=1, started=0.0, harness_version="t") as log:
        log.steps.append((0, 1.0, 1.5, 10))
        log.steps.append((0, 2.0, 2.25, 10))
        assert len(path.read_text().splitlines()) == 1  # header only: steps wait for the epoch
        log.epoch(epoch=0, steps=2, train_loss=float("nan"), train_accuracy=0.5, test_loss=1.0,
                  test_accuracy=0.5, epoch_seconds=3.0, test_seconds=0.5)
        summary = log.summary(diverged=True)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["header", "step", "step", "epoch", "summary"]
    assert [r["phase"] for r in records[1:3]] == ["warmup", "timed"]
    assert records[3]["train_loss"] is None
    assert summary["throughput"] == 40.0 and summary["time_to_first_step"] == 1.5
    assert summary["accuracy"] is None and summary["train_seconds"] == 3.0


def test_throughput_without_timed_steps_says_so(tmp_path: Path) -> None:
    with EventLog(tmp_path / "e.jsonl", warmup_steps=5, started=0.0, harness_version="t") as log:
        log.steps.extend([(0, 0.0, 1.0, 10), (0, 1.0, 1.5, 10)])
        summary = log.summary(diverged=False)
    assert summary["throughput"] == throughput(log.steps) == 15.0
    assert summary["timed_steps"] == 0 and summary["warmup_steps"] == 2
    assert "no timed steps" in summary["notes"][0]


def test_spec_errors_name_the_key(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "a")
    assert load_spec(spec)["params"]["model"] == "lenet5"

    params = dict(BASE_PARAMS)
    del params["batch_size"]
    spec.write_text(json.dumps({"schema_version": 1, "data_dir": "/d", "params": params}))
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert str(err.value) == f"{spec}: [params -> batch_size] is missing"

    with pytest.raises(SpecError) as err:
        load_spec(write_spec(tmp_path / "b", batch_size="big"))
    assert str(err.value) == f'{tmp_path / "b" / "spec.json"}: [params -> batch_size] expected a positive integer, got "big"'

    with pytest.raises(SpecError, match=r'\[params -> framework\] unknown framework "caffe" \(this harness knows '
                                        + ", ".join(known_frameworks()) + r"\)"):
        load_spec(write_spec(tmp_path / "c", framework="caffe"))

    spec.write_text(json.dumps({"schema_version": 9, "data_dir": "/d", "params": BASE_PARAMS}))
    with pytest.raises(SpecError, match=r"unknown schema_version 9 \(this harness reads 1\)"):
        load_spec(spec)

    with pytest.raises(SpecError, match=r"\[params -> cpuset\] CPU range \"3-1\" runs backwards"):
        load_spec(write_spec(tmp_path / "d", cpuset="3-1"))


def test_harness_imports_only_stdlib_frameworks_and_itself() -> None:
    """The core imports the standard library (and threadpoolctl); adapters add their framework.
    The core may also try numpy where it falls back to the standard library without it (an
    import inside ``try: … except ImportError``: the synthetic data's fast path, datasets.py)."""
    core = set(sys.stdlib_module_names) | {"threadpoolctl"}
    frameworks = {"torch", "tensorflow", "keras", "mxnet", "numpy", "jax", "jaxlib", "flax", "optax",
                  "theano", "chainer"}
    optional_in_core = {"numpy"}
    tried = 0
    for path in sorted(HARNESS_DIR.rglob("*.py")):
        allowed = core | frameworks if path.parent.name == "adapters" else core
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = set()  # imports inside a try whose handler catches ImportError
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                    isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                    for h in node.handlers):
                guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in allowed and id(node) in guarded and top in optional_in_core:
                    tried += 1
                    continue
                assert top in allowed, f"{path.name} imports {name}"
    assert tried == 1  # datasets.py's numpy; any other optional import is a decision to record here


# --- real runs in the torch environment -------------------------------------------------


# (model, input shape, classes, parameters as the reference implementations count them)
ZOO_PARITY = [
    ("lenet5", (1, 28, 28), 10, 61_706),
    ("cifar_cnn", (3, 32, 32), 10, 1_250_858),
    ("alexnet", (3, 224, 224), 1000, 62_378_344),
    ("resnet18", (3, 224, 224), 1000, 11_689_512),  # torchvision's resnet18
    ("resnet50", (3, 224, 224), 1000, 25_557_032),  # torchvision's resnet50
]


@pytest.mark.slow
def test_zoo_parameter_counts_match_models(torch_python: Path, stage: Path) -> None:
    """Every network the torch adapter builds has models.param_count trainable parameters, and
    one child module per entry of its layer list, named after it."""
    code = (
        "import json, sys\n"
        "from matrun.runner.harness.adapters.torch import build, parameter_count\n"
        "from matrun.runner.harness.models import MODELS, param_count\n"
        "for name, shape, classes in json.loads(sys.argv[1]):\n"
        "    model = build(name, tuple(shape), classes)\n"
        "    names = [n for n, _ in model.named_children()] == [layer[1] for layer in MODELS[name]]\n"
        "    print(name, parameter_count(model), param_count(name, tuple(shape), classes), names)\n"
    )
    cases = [[name, list(shape), classes] for name, shape, classes, _ in ZOO_PARITY]
    out = subprocess.run([str(torch_python), "-c", code, json.dumps(cases)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(stage)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{name} {count} {count} True" for name, _, _, count in ZOO_PARITY]


@pytest.mark.slow
def test_gpu_switches_as_configured(torch_python: Path, stage: Path) -> None:
    """No GPU here: check what ``configure`` sets for a gpu cell (the cuDNN / matmul flags are
    plain settings that exist without CUDA) and that ``layout`` reaches the conv weights."""
    code = (
        "import json, sys, torch\n"
        "from matrun.runner.harness.adapters import torch as pytorch\n"
        "for change in json.loads(sys.argv[2]):\n"
        "    params = {**json.loads(sys.argv[1]), **change}\n"
        "    pytorch.configure(params)\n"
        "    print(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,\n"
        "          torch.backends.cudnn.benchmark, pytorch._asked_device(params), pytorch._weight_layout(params['layout']))\n"
    )
    changes = [{"device": "gpu", "gpus": 1, "precision": "tf32", "conv_algo": "autotune"},
               {"device": "gpu", "gpus": 2, "precision": "fp32", "conv_algo": "heuristic", "layout": "nhwc"}]
    out = subprocess.run([str(torch_python), "-c", code, json.dumps(BASE_PARAMS), json.dumps(changes)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(stage)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True True True cuda:0 nchw", "False False False cuda:0 nhwc"]


@pytest.mark.slow
def test_synthetic_run_writes_every_event(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "run", onednn_check=True)
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    events = events_of(tmp_path / "run")

    types = [e["type"] for e in events]
    assert types[:4] == ["header", "probe", "data", "model"] and types[-2:] == ["summary", "end"]
    assert set(types[4:-2]) == {"step", "epoch", "phases"}
    for event in events:
        assert EVENT_KEYS[event["type"]] <= set(event), event["type"]
    assert events[0]["schema_version"] == 1

    probe = only(events, "probe")
    assert probe["framework"] == "torch" and probe["framework_version"].startswith("2.")
    assert IN_FORCE_KEYS <= set(probe["in_force"])
    assert probe["in_force"]["threads"] == 1 and probe["mismatches"] == []
    assert probe["in_force"]["affinity"] == sorted(os.sched_getaffinity(0))
    assert "PyTorch built with" in probe["build"]
    assert any(lib["name"].startswith("libgomp") for lib in probe["libraries"])

    assert only(events, "data") | {"load_seconds": 0} == {
        "type": "data", "dataset": "synthetic", "train_size": 512, "test_size": 128,
        "shape": [1, 28, 28], "classes": 10, "load_seconds": 0}
    assert only(events, "model") == {"type": "model", "name": "lenet5", "parameters": 61706, "flops": 833_040}

    steps = [e for e in events if e["type"] == "step"]
    epochs = [e for e in events if e["type"] == "epoch"]
    assert len(steps) == 3 * 16 and [e["steps"] for e in epochs] == [16, 16, 16]
    assert [s["step"] for s in steps] == list(range(48))
    # every 10th timed step (BASE_PARAMS' phase_sampling) is sampled: timed steps 9, 19, 29, 39
    sampled = {5 + k for k in (9, 19, 29, 39)}
    assert [s["phase"] for s in steps] == ["warmup"] * 5 + ["sampled" if i in sampled else "timed"
                                                           for i in range(5, 48)]
    assert all(s["seconds"] > 0 and s["images"] == 32 for s in steps)
    phases = [e for e in events if e["type"] == "phases"]
    assert [p["step"] for p in phases] == sorted(sampled)
    for record in phases:
        # torch eager, preloaded tensors: forward, backward and update, each its own, in order
        assert list(record["phases"]) == ["forward", "backward", "update"]
        assert all(v > 0 for v in record["phases"].values())
        step = next(s for s in steps if s["step"] == record["step"])
        assert record["seconds"] == step["seconds"] >= sum(record["phases"].values())
    for epoch in epochs:
        assert 0 <= epoch["train_accuracy"] <= 1 and 0 <= epoch["test_accuracy"] <= 1

    summary = only(events, "summary")
    assert (summary["timed_steps"], summary["warmup_steps"], summary["diverged"]) == (39, 5, False)
    timed = [s["seconds"] for s in steps if s["phase"] == "timed"]
    assert summary["throughput"] == pytest.approx(statistics.median(32 / t for t in timed))
    model = summary["phases"]
    assert (model["every"], model["sampled_steps"], model["fused"]) == (10, 4, [])
    assert model["order"] == ["forward", "backward", "update"]
    assert model["median"]["backward"] == pytest.approx(statistics.median(p["phases"]["backward"] for p in phases))
    assert model["unsampled_step_seconds_median"] == pytest.approx(statistics.median(timed))
    assert summary["gradient_bytes"] == 61706 * 4
    assert summary["throughput"] > 0 and 0 < summary["time_to_first_step"] < 60
    assert summary["train_seconds"] == pytest.approx(sum(e["epoch_seconds"] for e in epochs))
    assert summary["inference_seconds"] is None and summary["peak_device_memory_bytes"] is None

    # the oneDNN check: a verbose re-run of the harness, counted, its output kept out of the cell's
    assert probe["onednn_primitives"] > 0 and probe["onednn_primitive_kinds"]["convolution"] > 0
    assert probe["onednn_verbose_sample"][0].startswith("onednn_verbose,v1,primitive,exec,cpu,")
    assert 0 < probe["onednn_check_seconds"] < 60
    assert "onednn_verbose" not in out.stdout
    assert summary["time_to_first_step"] < 60
    assert summary["test_seconds"] == epochs[-1]["test_seconds"]
    assert summary["accuracy"] == epochs[-1]["test_accuracy"] > 0.5  # learnable, well above 1/10
    assert "notes" not in summary


@pytest.mark.slow
def test_fashion_mnist_slice_learns(torch_python: Path, stage: Path, fashion_mnist_root: Path,
                                    tmp_path: Path) -> None:
    spec = write_spec(tmp_path, fashion_mnist_root, dataset="fashion-mnist", train_limit=2000,
                      test_limit=500, epochs=1, optimizer="adam", lr=0.001, threads=2,
                      eval_batch_size=500)
    out = run_harness(torch_python, stage, spec, threads=2)
    assert out.returncode == 0, out.stderr
    events = events_of(tmp_path)
    assert only(events, "data")["train_size"] == 2000 and only(events, "data")["test_size"] == 500
    assert only(events, "probe")["in_force"]["threads"] == 2
    summary = only(events, "summary")
    assert summary["accuracy"] > 0.5
    assert summary["timed_steps"] + summary["warmup_steps"] + summary["phases"]["sampled_steps"] == 63  # 2000 / 32, last batch of 16 kept
    assert [e["images"] for e in events if e["type"] == "step"][-1] == 16


@pytest.mark.slow
def test_iterations_mode_runs_exactly_n_steps(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, epochs=None, iterations=7, synthetic_train=100, warmup_steps=2)
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    events = events_of(tmp_path)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == 7
    assert [(e["epoch"], e["steps"]) for e in events if e["type"] == "epoch"] == [(0, 4), (1, 3)]
    assert [s["images"] for s in steps] == [32, 32, 32, 4, 32, 32, 32]
    summary = only(events, "summary")
    assert (summary["timed_steps"], summary["warmup_steps"]) == (5, 2)


@pytest.mark.slow
def test_huge_learning_rate_diverges(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, lr=1e8, synthetic_train=256)
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    events = events_of(tmp_path)
    epochs = [e for e in events if e["type"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["train_loss"] is None  # stopped after the first epoch
    summary = only(events, "summary")
    assert summary["diverged"] is True and summary["accuracy"] is None
    assert summary["notes"] == ["training loss became nan in epoch 0; stopped"]
    assert events[-1]["type"] == "end"


@pytest.mark.slow
def test_bad_spec_exits_2_before_writing(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "fw", framework="caffe")
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 2
    assert out.stderr == (f'Error: {spec}: [params -> framework] unknown framework "caffe" '
                          f"(this harness knows {', '.join(known_frameworks())})\n")
    assert not (spec.parent / "events.jsonl").exists()

    spec = write_spec(tmp_path / "key")
    params = json.loads(spec.read_text())
    del params["params"]["seed"]
    spec.write_text(json.dumps(params))
    out = run_harness(torch_python, stage, spec)
    assert (out.returncode, out.stderr) == (2, f"Error: {spec}: [params -> seed] is missing\n")

    spec = write_spec(tmp_path / "shape", synthetic_shape=[1, 8, 8])
    out = run_harness(torch_python, stage, spec)
    assert (out.returncode, out.stderr.splitlines()[-1]) == (
        2, f"Error: {spec}: [params -> synthetic_shape] lenet5 needs a larger input than 8×8 "
           "(the feature map vanishes at conv2)")


@pytest.mark.slow
def test_unavailable_device_fails_with_a_recorded_mismatch(torch_python: Path, stage: Path,
                                                           tmp_path: Path) -> None:
    spec = write_spec(tmp_path, device="gpu", gpus=1)
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1].startswith(
        "Error: device 'gpu' was asked but CUDA is not available in this environment")
    events = events_of(tmp_path)
    assert [e["type"] for e in events] == ["header", "probe", "data"]
    assert "device: asked gpu, in force cpu" in only(events, "probe")["mismatches"]


@pytest.mark.slow
def test_missing_data_fails_with_exit_1(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "run", tmp_path / "empty", dataset="fashion-mnist")
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 1
    assert "Traceback" in out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"Error: dataset directory not found: {tmp_path / 'empty' / 'fashion-mnist'} (expected "
        f"{tmp_path / 'empty' / 'fashion-mnist' / 'train-images-idx3-ubyte'}[.gz] and the other IDX files); "
        "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or put the IDX files there")
    assert [e["type"] for e in events_of(tmp_path / "run")] == ["header", "probe"]


@pytest.mark.slow
def test_sigterm_keeps_the_buffered_steps(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, epochs=10_000)
    env = {**os.environ, "PYTHONPATH": str(stage), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(torch_python), "-m", "matrun.runner.harness", "--spec", str(spec),
                             "--out", str(tmp_path)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        events_file = tmp_path / "events.jsonl"
        deadline = time.monotonic() + 60
        while not (events_file.exists() and '"epoch"' in events_file.read_text()):
            assert time.monotonic() < deadline, "no epoch record within 60 s"
            time.sleep(0.05)
        time.sleep(0.05)  # into the next epoch: some steps are buffered, not yet written
        proc.terminate()
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()
    events = events_of(tmp_path)  # every line is whole JSON
    types = [e["type"] for e in events]
    assert "summary" not in types and types.count("epoch") >= 1
    steps = [e["step"] for e in events if e["type"] == "step"]
    assert steps == list(range(len(steps)))


@pytest.mark.slow
def test_harness_runs_without_host_dependencies(torch_python: Path, stage: Path) -> None:
    code = (
        "import sys\n"
        "from matrun.runner.harness.cell import run_cell\nfrom matrun.runner.harness import events, probe, spec\n"
        "from matrun.runner.harness import datasets as data\n"
        "from matrun.runner.harness.adapters import torch as pytorch\n"
        "from matrun.runner.harness.__main__ import main\n"
        "host = {'typer', 'rich', 'duckdb', 'polars', 'pyarrow', 'plotly', 'psutil', 'pydantic'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in host))\n"
        "print(sorted(m for m in sys.modules if m.startswith('matrun')\n"
        "             and not m.startswith('matrun.runner.harness') and m not in ('matrun', 'matrun.runner')))\n"
        "try:\n    import typer\nexcept ImportError:\n    print('no typer')\n"
    )
    out = subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(stage)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]", "no typer"]


def test_cpuset_parsing_and_formatting() -> None:
    from matrun.runner.harness.cpusets import format_cpuset, parse_cpuset

    assert parse_cpuset("0-1,3") == {0, 1, 3} and parse_cpuset("") == set()
    assert format_cpuset([3, 0, 1, 5, 6, 7]) == "0-1,3,5-7"
    assert parse_cpuset(format_cpuset({0, 2, 3, 4, 9})) == {0, 2, 3, 4, 9}
    with pytest.raises(ValueError, match=r'^expected a CPU list such as "0-3,6" \(or "" for no pinning\), got "a-b"$'):
        parse_cpuset("a-b")
    with pytest.raises(ValueError, match=r'^CPU range "3-1" runs backwards$'):
        parse_cpuset("0,3-1")


def test_dataset_names_and_shapes_are_written_once() -> None:
    """The harness's datasets module holds them; the spec's choices and staging derive theirs."""
    from matrun.runner.datasets import staging
    from matrun.runner.harness import spec

    from matrun.runner.harness import text

    assert data.DATASETS == (*data.IDX_DATASETS, data.SYNTHETIC)
    assert spec.PARAMS["dataset"].choices == data.DATASETS + text.TEXT_DATASETS  # images, then token data
    assert tuple(data.IDX_DATASETS) == tuple(data.IDX_SHAPES)
    assert staging.IMPORTABLE == (*data.IDX_DATASETS, text.FORTUNES)  # the generated ones need no import
    assert data.GENERATED == {data.SYNTHETIC, text.SYNTHETIC_TEXT}
    assert spec.input_shape({"dataset": "cifar10"}) == data.IDX_SHAPES["cifar10"] == (3, 32, 32)


def test_labels_are_int64_arrays() -> None:
    ds = data.synthetic((1, 12, 12), classes=300, train=50, test=5, seed=0)
    assert isinstance(ds.train.labels, array) and ds.train.labels.typecode == "q"
    assert max(ds.train.labels) < 300


def test_spec_as_the_host_writes_it_is_accepted(tmp_path: Path) -> None:
    """The host's canonical form nulls what a cell does not use (docs/BUNDLE.md)."""
    from matrun.runner.planning.matrix import parse_matrix

    (cell,) = parse_matrix({"fixed": {"dataset": "fashion-mnist", "optimizer": "adam", "iterations": 9}},
                           path=Path("matrix.toml")).cells
    params = dict(cell.values)
    assert params["synthetic_shape"] is None and params["momentum"] is None and params["epochs"] is None
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"schema_version": 1, "sweep": "s", "cell_id": "c", "repeat": 0, "attempt": 1,
                                "env_id": "e", "data_dir": "/d", "params": params}))
    assert load_spec(spec)["params"] == params
    # A null where the cell does use the key is still an error.
    params["optimizer"] = "sgd"
    spec.write_text(json.dumps({"schema_version": 1, "data_dir": "/d", "params": params}))
    with pytest.raises(SpecError, match=r"\[params -> momentum\]"):
        load_spec(spec)


# --- new parameters: spec checks, inference, layer profile, oneDNN check, precision, layout --


@pytest.mark.parametrize(("change", "problem"), [
    ({"device": "cuda"}, '[params -> device] expected one of "cpu", "gpu", got "cuda"'),
    ({"device": "gpu", "gpus": None}, "[params -> gpus] expected a positive integer, got null"),
    ({"layout": "nchwc"}, '[params -> layout] expected one of "nchw", "nhwc", got "nchwc"'),
    ({"precision": "fp8"}, '[params -> precision] expected one of "fp32", "tf32", "bf16", "fp16", got "fp8"'),
    ({"conv_algo": "fastest"}, '[params -> conv_algo] expected one of "heuristic", "autotune", got "fastest"'),
    ({"mode": "serve"}, '[params -> mode] expected one of "train", "inference", got "serve"'),
    ({"preset": "keras"}, '[params -> preset] expected one of "none", "framework-default", "study-a", got "keras"'),
    ({"onednn_check": "yes"}, '[params -> onednn_check] expected true or false, got "yes"'),
    ({"layer_profile": 1}, "[params -> layer_profile] expected true or false, got 1"),
    ({"optimizer": "lbfgs"}, '[params -> optimizer] expected one of "sgd", "adam", "adadelta", "rmsprop", got "lbfgs"'),
    ({"model": "vgg16"}, '[params -> model] expected one of "lenet5", "cifar_cnn", "alexnet", "resnet18", '
                         '"resnet50", "gpt-tiny", "gpt2-small", "vit-tiny", "vit-b16", got "vgg16"'),
    ({"model": "resnet18", "synthetic_shape": [3, 32, 32], "layer_profile": True},
     "[params -> layer_profile] needs a sequential network (lenet5, cifar_cnn, alexnet) or a transformer, not resnet18"),
    ({"model": "alexnet", "dataset": "fashion-mnist"},
     "[params -> model] alexnet needs a larger input than 28×28 (the feature map vanishes at pool2)"),
    ({"mode": "inference", "optimizer": None, "lr": None, "momentum": None, "weight_decay": None,
      "epochs": None, "iterations": 0, "layout": "x"}, '[params -> layout] expected one of "nchw", "nhwc", got "x"'),
])
def test_new_keys_are_checked(tmp_path: Path, change: dict[str, Any], problem: str) -> None:
    spec = write_spec(tmp_path, **change)
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert str(err.value) == f"{spec}: {problem}"


def test_new_keys_accept_their_values(tmp_path: Path) -> None:
    for i, change in enumerate([
        {"device": "gpu", "gpus": 4, "precision": "fp16", "conv_algo": "autotune", "layout": "nhwc"},
        {"optimizer": "adadelta", "momentum": None}, {"optimizer": "rmsprop", "momentum": None},
        {"model": "cifar_cnn", "dataset": "cifar10", "layer_profile": True, "preset": "framework-default"},
        {"model": "resnet50", "synthetic_shape": [3, 64, 64], "onednn_check": True},
    ]):
        assert load_spec(write_spec(tmp_path / str(i), **change))["params"] == {**BASE_PARAMS, **change}


def test_inference_spec_as_the_host_writes_it_is_accepted(tmp_path: Path) -> None:
    """Inference nulls the optimizer keys and epochs; a cpu cell nulls gpus (matrix.canonical)."""
    from matrun.runner.planning.matrix import parse_matrix

    (cell,) = parse_matrix({"fixed": {"dataset": "fashion-mnist", "mode": "inference", "layer_profile": True}},
                           path=Path("matrix.toml")).cells
    params = dict(cell.values)
    assert [params[k] for k in ("optimizer", "lr", "momentum", "weight_decay", "epochs", "gpus")] == [None] * 6
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"schema_version": 1, "data_dir": "/d", "params": params}))
    assert load_spec(spec)["params"] == params
    params["mode"] = "train"  # the same nulls in a training cell are errors, in the order of the keys
    spec.write_text(json.dumps({"schema_version": 1, "data_dir": "/d", "params": params}))
    with pytest.raises(SpecError, match=r"\[params -> epochs\] expected a positive integer, got null"):
        load_spec(spec)
    params["epochs"] = 1
    spec.write_text(json.dumps({"schema_version": 1, "data_dir": "/d", "params": params}))
    with pytest.raises(SpecError, match=r"\[params -> optimizer\] expected one of"):
        load_spec(spec)


def test_onednn_verbose_lines_are_counted() -> None:
    from matrun.runner.harness.probe import count_verbose

    stdout = "\n".join([
        "onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)",
        "onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation,prop_kind",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0,,6x1x5x5,0.0039",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32,,mb8,0.05",
        "dnnl_verbose,exec,cpu,convolution,gemm:jit,backward_data,src_f32::blocked:abcd:f0,,mb8,0.1",
        "mkldnn_verbose,exec,cpu,inner_product,gemm:jit,forward_inference,src_f32,,mb8,0.02",
        "onednn_verbose,v1,graph,exec,cpu,100002,matmul_post_ops,,fp32,,0.1",
        "done: train 0.1 s",
        "some,exec,line that is not oneDNN's",
    ])
    count, kinds, sample = count_verbose(stdout)
    assert count == 5
    assert kinds == {"reorder": 1, "convolution": 2, "inner_product": 1, "graph": 1}
    assert sample[0].startswith("onednn_verbose,v1,primitive,exec,cpu,reorder") and len(sample) == 3


def test_onednn_check_mismatches_and_failures() -> None:
    from matrun.runner.harness.probe import add_onednn_check, probe_params

    def check(primitives: int | None, error: str | None = None, kinds: dict | None = None) -> dict[str, Any]:
        return {"primitives": primitives, "kinds": kinds or {"convolution": primitives or 0},
                "sample": [], "seconds": 2.5, "error": error}

    for onednn, primitives, mismatch in [
        (True, 0, "onednn: asked true, but no oneDNN primitive ran (verbose check)"),
        (False, 7, "onednn: asked false, but 7 oneDNN layer primitives ran (verbose check)"),
        (True, 7, None), (False, 0, None),
    ]:
        fields: dict[str, Any] = {"mismatches": []}
        assert add_onednn_check(fields, {"onednn": onednn}, check(primitives)) == []
        assert fields["mismatches"] == ([mismatch] if mismatch else [])
        assert fields["onednn_primitives"] == primitives and fields["onednn_check_seconds"] == 2.5

    # oneDNN's gemm API called for plain matrix products (TensorFlow's Eigen path) is not a
    # layer primitive: counted, but not a mismatch of onednn = false.
    fields = {"mismatches": []}
    add_onednn_check(fields, {"onednn": False}, check(9, kinds={"gemm_api": 7, "reorder": 2}))
    assert fields["mismatches"] == ["onednn: asked false, but 2 oneDNN layer primitives ran (verbose check)"]
    fields = {"mismatches": []}
    add_onednn_check(fields, {"onednn": False}, check(7, kinds={"gemm_api": 7}))
    assert fields["mismatches"] == [] and fields["onednn_primitives"] == 7

    fields = {"mismatches": []}
    notes = add_onednn_check(fields, {"onednn": True}, check(None, "the verbose run exited 1: Error: boom"))
    assert notes == ["oneDNN check failed (the verbose run exited 1: Error: boom); primitives not counted"]
    assert fields["mismatches"] == [] and fields["onednn_check_error"] == "the verbose run exited 1: Error: boom"

    cut = probe_params({**BASE_PARAMS, "batch_size": 64, "layer_profile": True, "onednn_check": True})
    assert {k: cut[k] for k in ("iterations", "epochs", "warmup_steps", "batch_size", "eval_batch_size",
                                "layer_profile", "onednn_check", "train_limit", "test_limit",
                                "synthetic_train", "synthetic_test")} == {
        "iterations": 2, "epochs": None, "warmup_steps": 0, "batch_size": 8, "eval_batch_size": 8,
        "layer_profile": False, "onednn_check": False, "train_limit": 16, "test_limit": 8,
        "synthetic_train": 16, "synthetic_test": 8}


def test_onednn_check_fails_soft(tmp_path: Path) -> None:
    """The check re-runs the harness with this interpreter (the host's: no torch): a note, no raise."""
    from matrun.runner.harness.probe import onednn_check

    spec = json.loads(write_spec(tmp_path, onednn_check=True).read_text())
    result = onednn_check(spec)
    assert result["primitives"] is None and result["seconds"] > 0
    assert result["error"].startswith("the verbose run exited 1: Error: framework 'torch' cannot be imported")


@pytest.mark.slow
def test_inference_mode_times_forward_batches(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, mode="inference", optimizer=None, lr=None, momentum=None, weight_decay=None,
                      epochs=None, iterations=0, synthetic_test=100, warmup_steps=1)
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("done: inference ")
    events = events_of(tmp_path)
    assert [e["type"] for e in events] == ["header", "probe", "data", "model"] + ["step"] * 4 + ["summary", "end"]
    steps = [e for e in events if e["type"] == "step"]
    assert [(s["epoch"], s["step"], s["phase"], s["images"]) for s in steps] == [
        (0, 0, "warmup", 32), (0, 1, "timed", 32), (0, 2, "timed", 32), (0, 3, "timed", 4)]
    summary = only(events, "summary")
    assert summary["train_seconds"] is None and summary["test_seconds"] is None and summary["accuracy"] is None
    assert summary["inference_seconds"] >= sum(s["seconds"] for s in steps)
    assert summary["throughput"] == pytest.approx(throughput([(0, 0.0, s["seconds"], s["images"]) for s in steps[1:]]))
    assert (summary["timed_steps"], summary["warmup_steps"]) == (3, 1)

    # iterations > 0: that many batches, cycling over the test split
    spec = write_spec(tmp_path / "cycle", mode="inference", optimizer=None, lr=None, momentum=None,
                      weight_decay=None, epochs=None, iterations=6, synthetic_test=64, warmup_steps=1)
    assert run_harness(torch_python, stage, spec).returncode == 0
    steps = [e for e in events_of(tmp_path / "cycle") if e["type"] == "step"]
    assert [(s["epoch"], s["images"]) for s in steps] == [(0, 32), (0, 32), (1, 32), (1, 32), (2, 32), (2, 32)]


@pytest.mark.slow
def test_layer_profile_of_lenet5(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    from matrun.runner.harness.models import LENET5, walk

    spec = write_spec(tmp_path, layer_profile=True, epochs=1)
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    events = events_of(tmp_path)
    types = [e["type"] for e in events]
    assert types[-2 - len(LENET5):] == ["layer"] * len(LENET5) + ["summary", "end"]
    assert types.index("layer") > max(i for i, t in enumerate(types) if t == "epoch")
    layers = [e for e in events if e["type"] == "layer"]
    assert [(e["name"], e["kind"], e["index"]) for e in layers] == [(l[1], l[0], i) for i, l in enumerate(LENET5)]
    counted = {w["name"]: w for w in walk("lenet5", (1, 28, 28), 10)}
    for e in layers:
        assert EVENT_KEYS["layer"] <= set(e)
        assert e["forward_seconds"] > 0 and e["backward_seconds"] > 0, e
        assert e["repeats"] == 20 and e["images"] == 32
        expected = counted.get(e["name"], {"params": 0, "flops": 0})
        assert (e["params"], e["flops"]) == (expected["params"], expected["flops"])
    assert [e["flops"] for e in layers if e["kind"] == "conv"] == [235_200, 480_000]
    assert sum(e["params"] for e in layers) == 61_706


@pytest.mark.slow
def test_onednn_off_runs_no_onednn_primitive(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    """torch.backends.mkldnn.enabled = False really stops every oneDNN primitive (torch 2.13:
    convolutions and, under bf16 autocast, matmuls are oneDNN's; fp32 linear layers are MKL's).
    (Counting with oneDNN on: test_synthetic_run_writes_every_event.)"""
    spec = write_spec(tmp_path, onednn=False, onednn_check=True, epochs=None, iterations=2,
                      synthetic_train=64, synthetic_test=32, warmup_steps=1, precision="bf16")
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    probe = only(events_of(tmp_path), "probe")
    assert probe["onednn_primitives"] == 0 and probe["onednn_primitive_kinds"] == {}
    assert probe["in_force"]["onednn"] is False and probe["mismatches"] == []


@pytest.mark.slow
def test_bf16_and_nhwc_run_on_the_cpu(torch_python: Path, stage: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, precision="bf16", layout="nhwc")
    out = run_harness(torch_python, stage, spec)
    assert out.returncode == 0, out.stderr
    events = events_of(tmp_path)
    probe = only(events, "probe")
    assert probe["mismatches"] == []
    assert (probe["in_force"]["layout"], probe["in_force"]["precision"]) == ("nhwc", "bf16")
    assert only(events, "summary")["accuracy"] > 0.5


def test_jax_reads_the_autotune_level_xla_will_use() -> None:
    """The JAX adapter's GPU ``in_force.conv_algo`` comes from XLA_FLAGS as XLA reads it: the
    last ``--xla_gpu_autotune_level`` wins; none means XLA's own default (autotuning)."""
    from matrun.runner.harness.adapters import jax as jax_adapter

    assert jax_adapter._autotune_level("--xla_cpu_foo=1 --xla_gpu_autotune_level=0") == 0
    assert jax_adapter._autotune_level("--xla_gpu_autotune_level=0 --xla_gpu_autotune_level=4") == 4
    assert jax_adapter._autotune_level("") is None
    assert jax_adapter._autotune_level("--xla_gpu_autotune_level=4 --xla_gpu_autotune_level=x") is None
