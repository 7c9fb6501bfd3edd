"""The training knobs the studies turned (docs/HARNESS.md "Training knobs", docs/PRESETS.md):
``first_layer_backward``, ``validation`` + ``early_stopping``, ``input_pipeline`` +
``loader_workers`` and ``preset = "study-a"``.

Declared once in ``runner/harness/spec.py`` with today's behaviour as the default (no cell id
moves: tests/test_golden_ids.py); checked by the harness and the host; and exercised for real
in each framework's environment, single-process and multi-worker, asserting what each knob
measurably does: oneDNN's executed ``backward_data`` convolutions (the first layer's input
gradient), the epochs run, the loader workers that produced the batches, the warehouse row.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from matrun.errors import InputError, MatrixError
from matrun.frameworks import load_framework
from matrun.runner.executors.local import cell_environment
from matrun.runner.harness import datasets as data
from matrun.runner.harness import probe, spec
from matrun.runner.harness.cell import load_spec
from matrun.runner.harness.errors import DataError, SpecError
from matrun.runner.harness.events import EventLog
from matrun.runner.planning import presets
from matrun.runner.planning.matrix import parse_matrix

from test_frameworks import new_framework
from test_harness import BASE_PARAMS, events_of, only, write_spec
from test_sweep import matrun, sql
from test_workers import CPUSET, run_local, summary_of

KNOBS = {"first_layer_backward": ("skip", ("skip", "full")), "validation": (0, ()),
         "early_stopping": (0, ()), "input_pipeline": ("preloaded", ("preloaded", "loader")),
         "loader_workers": (0, ())}
FRAMEWORKS = ["torch", "tensorflow", "mxnet", "jax"]
# oneDNN's verbose counts show the first layer's backward-data pass where the convolutions are
# oneDNN's; XLA's are Eigen's: tests/test_jax.py counts the convolutions of the compiled step.
ONEDNN_CONVOLUTIONS = ["torch", "tensorflow", "mxnet"]
LAYOUT = {"torch": "nchw", "tensorflow": "nhwc", "mxnet": "nchw", "jax": "nhwc"}
# eval_batch_size 64: the test split (128) and a validation split of 64 are evaluated in batches
# of one shape, so JAX compiles one evaluation program, not one per split
TINY = {"dataset": "synthetic", "synthetic_train": 512, "synthetic_test": 128, "batch_size": 32,
        "eval_batch_size": 64, "warmup_steps": 2, "threads": 1, "onednn_check": False}


def cell(**fixed: Any) -> dict[str, Any]:
    (one,) = parse_matrix({"fixed": fixed}, path=Path("matrix.toml")).cells
    return dict(one.values)


def refused(fixed: dict[str, Any]) -> str:
    with pytest.raises(MatrixError) as err:
        parse_matrix({"fixed": fixed}, path=Path("matrix.toml"))
    return str(err.value)


# --- the declaration ---------------------------------------------------------------------


def test_knobs_are_declared_once_with_todays_behaviour_as_default() -> None:
    for name, (default, choices) in KNOBS.items():
        param = spec.PARAMS[name]
        assert (param.default, param.choices, param.in_spec, param.identity) == (default, choices, spec.OPTIONAL, True)
    assert spec.PRESETS == ("none", "framework-default", "study-a")


def test_the_defaults_spelled_out_keep_the_cell_id() -> None:
    plain = parse_matrix({"fixed": {"batch_size": 32}}, path=Path("m.toml")).cells[0]
    spelled = parse_matrix({"fixed": {"batch_size": 32, **{k: d for k, (d, _) in KNOBS.items()}}},
                           path=Path("m.toml")).cells[0]
    assert plain.identity == spelled.identity
    assert parse_matrix({"fixed": {"batch_size": 32, "validation": 100}}, path=Path("m.toml")).cells[0].identity \
        != plain.identity


def test_a_spec_without_the_keys_means_the_defaults(tmp_path: Path) -> None:
    params = load_spec(write_spec(tmp_path))["params"]  # a host older than the knobs
    assert not set(KNOBS) & set(params)
    assert {k: spec.setting(params, k) for k in KNOBS} == {k: d for k, (d, _) in KNOBS.items()}


@pytest.mark.parametrize(("change", "problem"), [
    ({"early_stopping": 2}, "[params -> early_stopping] needs validation > 0: it watches the accuracy on "
                            "held-out training samples"),
    ({"early_stopping": 2, "validation": 64, "epochs": None, "iterations": 40},
     "[params -> early_stopping] counts epochs: it needs iterations = 0 (an epoch-counted run), not iterations = 40"),
    ({"early_stopping": 2, "validation": 64, "workers": 2},
     '[params -> early_stopping] needs one process (workers = 1, nodes = 1, kvstore = "device"): the workers '
     "of a multi-worker cell cannot stop together"),
    ({"validation": 512}, "[params -> validation] must be smaller than the training split (512 samples), got 512"),
    ({"validation": 300, "train_limit": 200},
     "[params -> validation] must be smaller than the training split (200 samples), got 300"),
    ({"loader_workers": 2}, '[params -> loader_workers] needs input_pipeline = "loader" (the workers of a data '
                            'loader), not "preloaded"'),
    ({"mode": "inference", "optimizer": None, "lr": None, "momentum": None, "weight_decay": None, "epochs": None,
      "first_layer_backward": "full"},
     '[params -> first_layer_backward] is a training setting: an inference cell leaves it at its default '
     '("skip"), not "full"'),
    ({"first_layer_backward": "all"}, '[params -> first_layer_backward] expected one of "skip", "full", got "all"'),
    ({"input_pipeline": "tfdata"}, '[params -> input_pipeline] expected one of "preloaded", "loader", got "tfdata"'),
    ({"validation": -1}, "[params -> validation] expected a non-negative integer at most 10,000,000, got -1"),
    ({"loader_workers": 257}, "[params -> loader_workers] expected a non-negative integer at most 256, got 257"),
])
def test_the_cell_refuses_what_cannot_run(tmp_path: Path, change: dict[str, Any], problem: str) -> None:
    path = write_spec(tmp_path, **change)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value) == f"{path}: {problem}"


def test_the_knobs_that_can_run_are_accepted(tmp_path: Path) -> None:
    for i, change in enumerate([
        {"first_layer_backward": "full", "layer_profile": True},
        {"validation": 100, "early_stopping": 3},
        {"validation": 100, "workers": 2},  # a held-out split alone works with several workers
        {"input_pipeline": "loader", "loader_workers": 4},
        {"mode": "inference", "optimizer": None, "lr": None, "momentum": None, "weight_decay": None, "epochs": None,
         "first_layer_backward": "skip", "input_pipeline": "preloaded"},
    ]):
        assert load_spec(write_spec(tmp_path / str(i), **change))["params"] == {**BASE_PARAMS, **change}


@pytest.mark.xfail(not hasattr(__import__("matrun.runner.planning.matrix", fromlist=["x"]), "knob_problem"),
                   reason="runner/planning/matrix.py canonical does not call spec.knob_problem yet", strict=True)
def test_the_host_refuses_the_same_at_plan_time() -> None:
    assert "early_stopping needs validation > 0" in refused({"early_stopping": 2})
    assert "validation must be smaller than the training split (2,048 samples)" in refused(
        {"dataset": "synthetic", "validation": 4096})
    assert 'loader_workers needs input_pipeline = "loader"' in refused({"loader_workers": 1})
    assert "early_stopping counts epochs" in refused({"early_stopping": 1, "validation": 10, "iterations": 50})


def test_the_onednn_checks_short_run_feeds_preloaded_data_without_validation() -> None:
    short = probe.probe_params({**BASE_PARAMS, "validation": 5000, "early_stopping": 3,
                                "input_pipeline": "loader", "loader_workers": 4, "first_layer_backward": "full"})
    assert (short["validation"], short["early_stopping"], short["input_pipeline"], short["loader_workers"],
            short["first_layer_backward"]) == (0, 0, "preloaded", 0, "full")
    assert spec.first_problem(short) is None and spec.knob_problem(short) is None


# --- validation split and early-stopping bookkeeping --------------------------------------


def test_validation_holds_out_the_last_training_samples() -> None:
    params = {**BASE_PARAMS, "synthetic_train": 100, "train_limit": 80, "validation": 30}
    whole = data.load({**params, "validation": 0}, Path("/nonexistent"))
    split = data.load(params, Path("/nonexistent"))
    assert (split.train.count, split.validation.count, split.test.count) == (50, 30, whole.test.count)
    assert list(split.train.labels) == list(whole.train.labels[:50])
    assert list(split.validation.labels) == list(whole.train.labels[50:80])
    assert split.train.images + split.validation.images == whole.train.images
    assert whole.validation is None
    with pytest.raises(DataError, match=r"validation = 80 must be smaller than the training split of synthetic "
                                        r"\(80 samples after train_limit\)"):
        data.load({**params, "validation": 80}, Path("/nonexistent"))


def test_early_stopping_counts_epochs_since_the_best_validation_accuracy(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", warmup_steps=0, started=0.0, harness_version="t")
    stops = []
    for epoch, accuracy in enumerate([0.5, 0.6, 0.6, 0.55, 0.7, 0.7, 0.7]):
        log.steps.append((epoch, 0.0, 0.1, 10))
        log.epoch(epoch=epoch, steps=1, train_loss=1.0, train_accuracy=0.5, test_loss=1.0, test_accuracy=0.5,
                  epoch_seconds=0.1, test_seconds=0.01, validation=(1.0, accuracy, 0.01))
        stops.append((log.best_epoch(), log.should_stop(2), log.should_stop(0)))
    assert stops == [(0, False, False), (1, False, False), (1, False, False), (1, True, False),
                     (4, False, False), (4, False, False), (4, True, False)]
    summary = log.summary(diverged=False, extra={"stopped_early": True})
    log.close()
    assert (summary["epochs_run"], summary["best_epoch"], summary["stopped_early"]) == (7, 4, True)
    record = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()][2]
    assert record["type"] == "epoch" and (record["validation_accuracy"], record["validation_loss"]) == (0.5, 1.0)


# --- presets -----------------------------------------------------------------------------


@pytest.mark.parametrize(("framework", "dataset", "expected"), [
    ("tensorflow", "mnist", {"optimizer": "adam", "lr": 0.0001, "batch_size": 50, "iterations": 20000,
                             "epochs": None, "validation": 5000, "momentum": None}),
    ("tensorflow", "fashion-mnist", {"optimizer": "adam", "lr": 0.0001, "batch_size": 50, "iterations": 20000,
                                     "validation": 5000}),
    ("tensorflow", "cifar10", {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "batch_size": 128,
                               "iterations": 1000000, "epochs": None, "validation": 0}),
    ("torch", "mnist", {"optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "batch_size": 10, "epochs": 12,
                        "iterations": 0, "validation": 0}),
    ("torch", "cifar10", {"optimizer": "sgd", "lr": 0.01, "momentum": 0.0, "batch_size": 1, "epochs": 45}),
])
def test_study_a_gives_the_tables_defaults(framework: str, dataset: str, expected: dict[str, Any]) -> None:
    values = cell(framework=framework, dataset=dataset, preset="study-a")
    assert {k: values[k] for k in expected} == expected


def test_study_a_refuses_a_framework_study_a_did_not_measure() -> None:
    assert ('preset "study-a" (the defaults study A\'s Tables II and III list) has no settings for mxnet; '
            "frameworks that have them: tensorflow, theano, torch") in refused({"framework": "mxnet", "preset": "study-a"})
    assert 'preset "study-a" has no torch settings for dataset \'synthetic\' (it has: mnist, fashion-mnist, cifar10)' \
        in refused({"framework": "torch", "preset": "study-a", "dataset": "synthetic"})


def test_epochs_and_iterations_are_one_length() -> None:
    # the matrix's length wins, and the preset's other length key does not sneak back
    mine = cell(framework="tensorflow", dataset="mnist", preset="study-a", epochs=2)
    assert (mine["epochs"], mine["iterations"], mine["lr"], mine["validation"]) == (2, 0, 0.0001, 5000)
    mine = cell(framework="torch", dataset="mnist", preset="study-a", iterations=300)
    assert (mine["epochs"], mine["iterations"], mine["batch_size"]) == (None, 300, 10)
    mine = cell(framework="tensorflow", dataset="mnist", preset="study-a", iterations=0, epochs=1, validation=0)
    assert (mine["epochs"], mine["iterations"], mine["validation"]) == (1, 0, 0)
    # framework-default: the same rule, its values unchanged
    fd = cell(framework="torch", dataset="mnist", preset="framework-default")
    assert (fd["optimizer"], fd["lr"], fd["batch_size"], fd["epochs"], fd["iterations"]) == ("adadelta", 1.0, 64, 14, 0)
    fd = cell(framework="torch", dataset="mnist", preset="framework-default", iterations=50)
    assert (fd["epochs"], fd["iterations"]) == (None, 50)


def test_an_inference_cell_takes_no_training_knob_from_the_preset() -> None:
    values = cell(framework="tensorflow", dataset="mnist", preset="study-a", mode="inference", iterations=8)
    assert (values["validation"], values["optimizer"], values["batch_size"]) == (0, None, 50)


def _load_presets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, edit: str) -> None:
    folder = new_framework(tmp_path)
    toml = folder / "framework.toml"
    toml.write_text(toml.read_text(encoding="utf-8") + edit, encoding="utf-8")
    fw = load_framework(folder)
    monkeypatch.setattr(presets, "frameworks", lambda: {"newfw": fw})
    presets.preset_tables()


@pytest.mark.parametrize(("edit", "problem"), [
    ('\n[presets-study-b.mnist]\nlr = 0.1\n', "images/newfw/framework.toml: unknown key(s) presets-study-b"),
    ('\n[presets-study-a.svhn]\nlr = 0.1\n',
     "images/newfw/framework.toml [presets-study-a.svhn]: unknown dataset family 'svhn' (known: cifar10, mnist)"),
])
def test_preset_tables_are_read_strictly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, edit: str,
                                         problem: str) -> None:
    with pytest.raises(InputError) as err:
        _load_presets(monkeypatch, tmp_path, edit)
    assert str(err.value) == problem


@pytest.mark.parametrize(("old", "new", "problem"), [
    ("lr = 0.05\n", "lr = -0.05\n", "images/newfw/framework.toml [presets-study-a.mnist]: lr expected a positive "
                                    "learning rate, got -0.05"),
    ("epochs = 12\n", "epochs = 12\niterations = 7\n",
     "images/newfw/framework.toml [presets-study-a.mnist]: sets both epochs and iterations; a preset gives one length"),
    ("epochs = 12\n", "epochz = 12\n", "images/newfw/framework.toml [presets-study-a.mnist]: unknown parameter(s) epochz"),
])
def test_a_bad_study_a_value_names_the_file_table_and_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           old: str, new: str, problem: str) -> None:
    folder = new_framework(tmp_path)
    toml = folder / "framework.toml"
    text = toml.read_text(encoding="utf-8")
    at = text.index("[presets-study-a.mnist]")
    toml.write_text(text[:at] + text[at:].replace(old, new, 1), encoding="utf-8")
    with pytest.raises(InputError) as err:
        monkeypatch.setattr(presets, "frameworks", lambda: {"newfw": load_framework(folder)})
        presets.preset_tables()
    assert str(err.value) == problem


# --- real runs in each framework's environment ---------------------------------------------


def harness(env: Any, stage: Path, run_dir: Path, *, verbose: bool = False, **params: Any
            ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """The harness with the local executor's environment for the cell (oneDNN's verbose log
    on when asked), and its events."""
    path = write_spec(run_dir, **params)
    env_vars = cell_environment(json.loads(path.read_text(encoding="utf-8"))["params"], stage)
    if verbose:
        env_vars.update(ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", MKLDNN_VERBOSE="1")
    proc = subprocess.run([str(env.python), "-m", "matrun.runner.harness", "--spec", str(path), "--out", str(run_dir)],
                          capture_output=True, text=True, env=env_vars, cwd=run_dir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, events_of(run_dir)


def convolutions(stdout: str, kind: str) -> int:
    """oneDNN convolution primitives of ``kind`` (``backward_data``, …) that executed."""
    return sum(1 for line in stdout.splitlines() if ",exec," in line and "convolution" in line and f",{kind}," in line)


@pytest.fixture(scope="session")
def framework_env() -> Any:
    """``framework -> its real cpu environment`` (built once, then reused), as the local executor uses."""
    from matrun.runner.environments.venvs import ensure_env

    return lambda framework: ensure_env(framework, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("framework", ONEDNN_CONVOLUTIONS)
def test_first_layer_backward_full_computes_the_input_gradient(tmp_path: Path, stage: Path, framework_env: Any,
                                                               framework: str) -> None:
    """LeNet-5 has two convolutions: 3 training steps run conv2's backward-data pass (the
    gradient with respect to its input) 3 times with "skip" and both convolutions' 6 times
    with "full"; in the layer profile, conv1's backward computes it too with "full" only:
    25 calls (5 warm-up + 20 timed) more."""
    counts, summaries = {}, {}
    for mode in ("skip", "full"):
        proc, events = harness(framework_env(framework), stage, tmp_path / mode, verbose=True, framework=framework,
                               layout=LAYOUT[framework], epochs=None, iterations=3, warmup_steps=0,
                               synthetic_train=96, synthetic_test=32, eval_batch_size=32, first_layer_backward=mode,
                               layer_profile=True)
        counts[mode] = convolutions(proc.stdout, "backward_data")
        summaries[mode] = only(events, "summary")
    assert counts["skip"] >= 3 + 25 and counts["full"] - counts["skip"] == 3 + 25, counts
    assert [(s["first_layer_backward"], s["input_gradient_steps"]) for s in summaries.values()] == [
        ("skip", 0), ("full", 3)]


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_early_stopping_stops_when_validation_accuracy_stalls(tmp_path: Path, framework_env: Any,
                                                              framework: str) -> None:
    """A learning rate of 1e-12 leaves the predictions (and so the validation accuracy) where
    they started: with patience 2, epochs 0, 1, 2 run and training stops, 7 epochs early."""
    framework_env(framework)
    p = cell(framework=framework, layout=LAYOUT[framework], **TINY, lr=1e-12, momentum=0.0, epochs=10,
             validation=64, early_stopping=2)
    outcome, run_dir = run_local(tmp_path, p)
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
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_loader_feeds_the_steps(tmp_path: Path, framework_env: Any, framework: str) -> None:
    """loader_workers = 2: the framework's loader made every batch (torch and MXNet: in two
    worker processes; TensorFlow: a tf.data pipeline with a parallel map and a prefetch; JAX,
    which has no loader: two threads of a pool), and torch, MXNet and JAX, fed the same
    permutation, train exactly as from preloaded tensors."""
    framework_env(framework)
    common = dict(framework=framework, layout=LAYOUT[framework], **TINY, epochs=2)
    runs = {}
    for name, extra in {"preloaded": {}, "loader": {"input_pipeline": "loader", "loader_workers": 2}}.items():
        outcome, run_dir = run_local(tmp_path, cell(**common, **extra), name)
        assert outcome.status == "ok", outcome.error_tail
        runs[name] = events_of(run_dir)
    pipeline = only(runs["loader"], "summary")["input_pipeline"]
    steps = len([e for e in runs["loader"] if e["type"] == "step"])
    assert pipeline["kind"] == "loader" and pipeline["workers"] == 2 and pipeline["batches"] == steps == 32
    assert only(runs["preloaded"], "summary")["input_pipeline"] == {"kind": "preloaded"}
    if framework == "tensorflow":
        assert pipeline["dataset_ops"][:5] == ["TensorSliceDataset", "ShuffleDatasetV3", "ParallelMapDatasetV2",
                                               "BatchDatasetV2", "PrefetchDataset"]
        assert pipeline["num_parallel_calls"] == 2 and pipeline["prefetch"] == 4
    else:
        assert (pipeline["workers_seen"], pipeline["batches_in_process"]) == (2, 0)
        losses = {name: [e["train_loss"] for e in events if e["type"] == "epoch"] for name, events in runs.items()}
        assert losses["loader"] == pytest.approx(losses["preloaded"], rel=1e-5)


@pytest.mark.slow
def test_a_loader_without_workers_loads_in_the_training_process(tmp_path: Path, torch_env: Any) -> None:
    outcome, run_dir = run_local(tmp_path, cell(**TINY, epochs=1, input_pipeline="loader"))
    assert outcome.status == "ok", outcome.error_tail
    pipeline = only(events_of(run_dir), "summary")["input_pipeline"]
    assert (pipeline["workers"], pipeline["workers_seen"], pipeline["batches_in_process"]) == (0, 0, 16)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_multi_worker_cells_turn_the_knobs_too(tmp_path: Path, framework_env: Any, framework: str) -> None:
    """Two workers, each fetching its share of the global batches from a one-worker loader and
    computing the first layer's input gradient; rank 0 evaluates the held-out split."""
    framework_env(framework)
    extra = {"kvstore": "dist_sync"} if framework == "mxnet" else {}
    p = cell(framework=framework, workers=2, **{**TINY, "threads": 2}, iterations=12, **CPUSET, **extra,
             input_pipeline="loader", loader_workers=1, first_layer_backward="full", validation=64)
    outcome, run_dir = run_local(tmp_path, p)
    assert outcome.status == "ok", outcome.error_tail
    summary = summary_of(run_dir)
    assert summary["workers"] == 2 and summary["replicas_identical"] is True
    assert summary["input_gradient_steps"] == 12 and summary["input_pipeline"]["batches"] == 12
    epochs = [e for e in events_of(run_dir) if e["type"] == "epoch"]
    assert all(e["validation_accuracy"] is not None for e in epochs)
    worker1 = [json.loads(line) for line in (run_dir / "workers" / "worker-1" / "events.jsonl").read_text().splitlines()]
    other = next(r for r in worker1 if r["type"] == "summary")
    assert other["input_gradient_steps"] == 12 and other["input_pipeline"]["batches"] == 12


@pytest.mark.slow
def test_early_stopping_reaches_the_warehouse(tmp_path: Path, torch_env: Any) -> None:
    (tmp_path / "m.toml").write_text(textwrap.dedent("""
        [sweep]
        name = "knobs"
        repeats = 1
        timeout = 300

        [fixed]
        dataset = "synthetic"
        synthetic_train = 256
        synthetic_test = 64
        batch_size = 32
        warmup_steps = 2
        threads = 1
        onednn_check = false
        momentum = 0.0
        epochs = 8
        validation = 64

        [[zip]]
        lr = [1e-12, 0.05]
        early_stopping = [1, 0]
        """), encoding="utf-8")
    matrun("sweep", "m.toml", "--executor", "local", cwd=tmp_path)
    rows = sql(tmp_path / "matrun.duckdb", "SELECT lr, status, epochs_run, stopped_early, best_epoch "
                                           "FROM run_overview ORDER BY lr")
    assert rows[0][:4] == (1e-12, "ok", 2, True) and rows[0][4] == 0
    assert rows[1][:4] == (0.05, "ok", 8, False) and rows[1][4] is not None
