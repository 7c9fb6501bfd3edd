"""benchmarks/gpu_check.py (issue 26): its bad input (a --python that is not an interpreter, a
GPU check on a host without a GPU, unknown frameworks or precisions) and the matrix it sweeps.
The check itself needs a GPU and the frameworks: docs/frameworks/torch.md and jax.md hold the
table it printed on an H100."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from matrun.runner.planning.matrix import parse_matrix
from matrun.tomltext import loads

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("python, message", [
    ("/nonexistent/python", "Error: --python /nonexistent/python: no such file"),
    ("/tmp", "Error: --python /tmp: not an executable file (a Python interpreter is wanted)"),
    ("/etc/passwd", "Error: --python /etc/passwd: not an executable file (a Python interpreter is wanted)"),
    ("not/a/python", "Error: --python not/a/python: no such file (give an absolute path to a Python interpreter)"),
    ("a\nb", "Error: --python 'a\\nb': not a path"),
])
def test_a_python_that_is_not_an_interpreter_is_refused(tmp_path: Path, python: str, message: str) -> None:
    proc = check("--python", python, tmp_path=tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (2, message)
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_an_executable_that_is_not_python_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    proc = check("--python", str(fake), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"Error: --python {fake}: not a working Python interpreter (JSONDecodeError)"


def test_a_python_without_any_framework_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    proc = check("--python", str(bare / "bin" / "python"), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"Error: --python {bare / 'bin' / 'python'}: has none of torch, jax, "
                                   "tensorflow, mxnet")


def test_a_gpu_check_on_a_host_without_a_gpu_says_so(tmp_path: Path) -> None:
    gpu = load_script().gpu_present(sys.executable)
    if gpu is not None:
        pytest.skip(f"this host has a GPU: {gpu}")
    # the test venv has no framework; a framework-less check is refused before the GPU is looked
    # for, so the GPU refusal is checked on the script's own function and on a faked framework
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--python", sys.executable, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake)})
    assert (proc.returncode, proc.stderr.strip()) == (2, (
        "Error: no GPU on this host (neither NVML through --python nor nvidia-smi sees one); "
        "--device cpu rehearses the check on the CPU"))


@pytest.mark.parametrize("args, message", [
    (["--frameworks", "torch,caffe"], "Error: --frameworks: unknown caffe; known: torch, jax, tensorflow, mxnet"),
    (["--precisions", "fp64"], "Error: --precisions: unknown fp64; known: bf16, fp16, fp32, tf32"),
    (["--repeats", "0"], "Error: --repeats: 0 is not from 1 to 20"),
])
def test_unknown_frameworks_precisions_and_repeats_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    proc = check("--python", sys.executable, *args, tmp_path=tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (2, message)


def test_the_matrix_holds_exactly_the_configurations_at_each_frameworks_gpu_defaults(tmp_path: Path) -> None:
    gc = load_script()
    text = gc.matrix_text("/usr/bin/python3", ["torch", "jax"], "gpu", gc.sizes("gpu"), tmp_path, [], 2)
    matrix = parse_matrix(loads(text), path=tmp_path / "matrix.toml")
    got = [(c.values["framework"], c.values["precision"], c.values["layout"], c.values["conv_algo"])
           for c in matrix.cells]
    assert got == [("torch", "fp32", "nchw", "heuristic"), ("torch", "tf32", "nchw", "heuristic"),
                   ("torch", "bf16", "nchw", "heuristic"), ("torch", "bf16", "nhwc", "heuristic"),
                   ("jax", "fp32", "nhwc", "autotune"), ("jax", "bf16", "nhwc", "autotune")]
    assert matrix.sweep.repeats == 2
    assert {(c.values["model"], c.values["batch_size"], c.values["iterations"], c.values["variant"])
            for c in matrix.cells} == {("resnet50", 128, 60, "system")}
    only = gc.matrix_text("/usr/bin/python3", ["jax"], "gpu", gc.sizes("gpu"), tmp_path, ["bf16"], 1)
    (cell,) = parse_matrix(loads(only), path=tmp_path / "matrix.toml").cells  # no [fixed]-only extra cell
    assert (cell.values["framework"], cell.values["precision"]) == ("jax", "bf16")


def test_every_epochs_evaluation_counts_as_evaluation_not_fixed_cost(tmp_path: Path) -> None:
    gc = load_script()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    lines = [{"type": "header"}, {"type": "data", "load_seconds": 1.25},
             {"type": "epoch", "epoch": 0, "test_seconds": 4.0},  # its evaluation program compiled
             {"type": "epoch", "epoch": 1, "test_seconds": 0.5, "validation_seconds": 0.25}]
    (bundle / "events.jsonl").write_text("\n".join(map(json.dumps, lines)) + '\n{"type": "epo', encoding="utf-8")
    assert gc.bundle_times(bundle) == (1.25, 4.75)  # the line cut mid-record ends the reading
    assert gc.bundle_times(tmp_path / "missing") == (None, None)
    run = {"framework": "jax", "precision": "bf16", "layout": "nhwc", "conv_algo": "autotune", "status": "ok",
           "throughput": 100.0, "wall_seconds": 20.0, "timed_s": 5.0, "test_seconds": 0.5, "data_s": 1.25,
           "eval_s": 4.75}
    oracle = {"framework": "jax", "precision": "bf16", "layout": "nhwc", "img_s": 100.0, "process_s": 12.0,
              "timed_s": 2.0, "ready_s": 3.0}
    text = "\n".join(gc.table([run], [oracle]))
    # wall 20 - timed 5 - evaluation 4.75 = 10.25 fixed; the oracle's 12 - 2 = 10: +0.25 beyond it
    assert "| jax | bf16 | nhwc | 20.0 | 5.00 | 4.75 | 10.25 | 10.00 | +0.25 | 1.25 | 3.00 |" in text
    assert "| jax | bf16 | nhwc | autotune | 100 | 100 | 1.000 |" in text


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "Error: --steps and --warmup must be at least 1"),
    (["--warmup", "-3"], "Error: --steps and --warmup must be at least 1"),
])
def test_the_jax_step_gap_benchmark_refuses_bad_counts(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "jax_step_gap.py"), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == message and "Traceback" not in proc.stderr
