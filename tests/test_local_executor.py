"""The local executor: the exact environment a cell gets, and real harness subprocesses
that succeed, crash and time out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from matrun.warehouse.bundles.layout import EVENTS, MONITOR, SPEC, STDERR
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.runner.executors.protocol import RunRequest
from matrun.runner.executors.registry import get_executor
from matrun.runner.executors.local import LocalExecutor, cell_environment, harness_command
from matrun.runner.planning.matrix import parse_matrix

TINY = {"dataset": "synthetic", "synthetic_train": 256, "synthetic_test": 128,
        "batch_size": 32, "epochs": 1, "warmup_steps": 2, "threads": 1}


def params(**overrides) -> dict:
    (cell,) = parse_matrix({"fixed": {**TINY, **overrides}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


def run_cell(tmp_path: Path, p: dict, *, timeout: float = 120.0, data_dir: Path = Path("/nonexistent")):
    run_dir = tmp_path / "bundle"
    run_dir.mkdir()
    write_json_atomic(run_dir / SPEC, {"schema_version": 1, "sweep": "t", "cell_id": "c" * 16, "repeat": 0,
                                       "attempt": 1, "env_id": "e", "data_dir": str(data_dir), "params": p})
    outcome = LocalExecutor().run(RunRequest(run_dir=run_dir, params=p, env_id="e", timeout=timeout,
                                             data_dir=data_dir))
    return outcome, run_dir


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / EVENTS).read_text().splitlines()]


def test_cell_environment_is_exact():
    base = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "8",
            "PYTHONPATH": "/somewhere/else", "VIRTUAL_ENV": "/host/venv", "MKL_DYNAMIC": "TRUE",
            "KMP_AFFINITY": "compact", "ONEDNN_VERBOSE": "1", "OPENBLAS_CORETYPE": "Haswell"}
    env = cell_environment(params(threads=2, seed=7), Path("/stage"), base)
    assert env == {
        "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "OPENBLAS_CORETYPE": "Haswell",
        "PYTHONPATH": "/stage", "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "7",
        "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "BLIS_NUM_THREADS": "2",
        "VECLIB_MAXIMUM_THREADS": "2", "NUMEXPR_NUM_THREADS": "2",
    }


def test_unset_threads_leaves_no_thread_variables():
    env = cell_environment(params(threads="unset"), Path("/stage"), {"OMP_NUM_THREADS": "8", "PATH": "/bin"})
    assert not any(k.endswith("_THREADS") for k in env)


def test_command_is_an_argument_list_without_a_shell():
    cmd = harness_command(Path("/env/bin/python"), Path("/r/b"))
    assert cmd == ["/env/bin/python", "-m", "matrun.runner.harness", "--spec", "/r/b/spec.json", "--out", "/r/b"]


def test_auto_picks_local_when_no_engine_answers_and_says_so(tmp_path):
    missing = f"unix://{tmp_path}/no-engine.sock"
    executor, sentence = get_executor("auto", docker_host=missing)
    assert executor.name == "local"
    assert sentence == f"executor: local (auto: no Docker engine answers at {missing})"


@pytest.mark.parametrize("host", ["tcp://10.0.0.5:2375", "tcp://172.17.0.1:2375", "ssh://user@example"])
def test_auto_never_talks_to_a_remote_engine(host):
    executor, sentence = get_executor("auto", docker_host=host)
    assert executor.name == "local"
    assert "is not local" in sentence


@pytest.mark.slow
def test_real_cell_runs_ok_with_monitor_and_pinning(tmp_path, torch_env):
    outcome, run_dir = run_cell(tmp_path, params(cpuset="0", epochs=2))
    assert outcome.status == "ok", outcome.error_tail
    assert outcome.exit_code == 0 and outcome.error_tail == ""
    kinds = [e["type"] for e in events(run_dir)]
    assert kinds[0] == "header" and kinds[-1] == "end" and "summary" in kinds
    probe = next(e for e in events(run_dir) if e["type"] == "probe")
    assert probe["in_force"]["affinity"] == [0]
    assert probe["in_force"]["threads"] == 1
    assert probe["mismatches"] == []
    samples = (run_dir / MONITOR).read_text().splitlines()
    assert json.loads(samples[0]) == {"type": "header", "schema_version": 1, "interval_s": 0.2,
                                      "pid": json.loads(samples[0])["pid"]}
    assert len(samples) > 2  # a couple of seconds at 5 samples a second
    assert outcome.monitor["samples"] == len(samples) - 1
    assert outcome.monitor["rss_peak_bytes"] > 50 * 2**20  # torch is loaded
    assert 0 < outcome.monitor["cpu_total_avg"] <= 110  # pinned to one CPU


@pytest.mark.slow
def test_crash_is_a_failed_run_with_the_error_tail(tmp_path, torch_env):
    outcome, run_dir = run_cell(tmp_path, params(dataset="mnist"), data_dir=tmp_path / "empty")
    assert outcome.status == "failed"
    assert outcome.exit_code not in (0, None)
    assert "mnist" in outcome.error_tail and "[matrun] exit code" in outcome.error_tail
    assert (run_dir / STDERR).read_text() in outcome.error_tail


@pytest.mark.slow
def test_timeout_kills_the_cell_tree(tmp_path, torch_env):
    big = params(synthetic_train=200_000, synthetic_shape=[3, 64, 64], epochs=50)
    outcome, run_dir = run_cell(tmp_path, big, timeout=3)
    assert outcome.status == "timeout"
    assert "killed after the cell's timeout of 3 s" in outcome.error_tail
    # killed at its timeout, not before; the bound only says it did not run on (the cell alone would take many minutes)
    assert 3 <= outcome.wall_seconds < 120
    pid = json.loads((run_dir / MONITOR).read_text().splitlines()[0])["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_gpu_cell_environment_names_its_gpus():
    """No GPU here: this is what a 2-GPU cell would be started with (untested on a GPU)."""
    env = cell_environment(params(device="gpu", variant="cuda", gpus=2, threads=4), Path("/stage"),
                           {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "5,6,7"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["OMP_NUM_THREADS"] == "4"


def test_gpu_cells_are_refused_on_a_host_without_gpus(tmp_path):
    from matrun.errors import MatrunError
    from matrun.runner.planning.matrix import load_matrix
    from matrun.runner.planning.identity import plan_cells
    from matrun.runner.planning.preflight import host_gpus, preflight

    if host_gpus():
        pytest.skip(reason="this host has GPUs; the refusal is for hosts without")
    (tmp_path / "matrix.toml").write_text('[fixed]\ndataset = "synthetic"\ndevice = "gpu"\nvariant = "cuda"\ngpus = 2\n')
    cells = plan_cells(load_matrix(tmp_path / "matrix.toml"), lambda fw, v: "env")
    with pytest.raises(MatrunError) as info:
        preflight(cells, tmp_path)
    assert str(info.value) == ("cell framework=torch model=lenet5 dataset=synthetic: asks for 2 GPU(s); this host "
                               'has 0 (counted as /dev/nvidia<N> devices); run it on a GPU host or use device = "cpu"')
