"""`matrun sweep --executor docker` end to end on a real Docker engine: every framework's cell in
its own container of the built image, each run in DuckDB with the image it ran in; an OOM, a
cancelled sweep that leaves no container, `matrun build` / `matrun images` through the CLI, and
the refusals that come before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from matrun.runner.environments.contexts import recipe_hash
from test_sweep import sql

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
# No oneDNN check (the harness's second, verbose run of the cell): no test here looks at what it
# finds; tests/test_harness.py and the framework files check it.
TINY = """
[fixed]
dataset = "synthetic"
synthetic_train = 256
synthetic_test = 128
batch_size = 32
epochs = 1
warmup_steps = 2
threads = 1
cpuset = "0"
onednn_check = false
"""


def matrun(*args: str, cwd: Path, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"matrun {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_matrix(tmp_path: Path, body: str, name: str | None = None) -> str:
    name = name or f"d{uuid.uuid4().hex[:10]}"
    (tmp_path / "matrix.toml").write_text(f'[sweep]\nname = "{name}"\nexecutor = "docker"\n{TINY}{body}')
    return name


def containers_of(client, sweep: str) -> list:
    # sparse: the list as the engine gives it, without inspecting each container (one removed in
    # between would raise NotFound)
    return client.containers.list(all=True, sparse=True, filters={"label": f"matrun.sweep={sweep}"})


@pytest.mark.slow
def test_each_framework_runs_in_its_image_and_lands_in_duckdb_with_the_image(tmp_path, docker_client, cpu_images):
    name = write_matrix(tmp_path, '[axes]\nframework = ["torch", "tensorflow", "mxnet", "jax"]\n')
    proc = matrun("sweep", cwd=tmp_path)
    assert "executor: docker" in proc.stderr
    assert "4 runs (4 ok)" in proc.stdout
    rows = sql(tmp_path / "matrun.duckdb",
               "SELECT params ->> 'framework', status, executor, env_id, image_tag, image_id, image_digest, "
               "accuracy IS NOT NULL, throughput > 0, monitor_samples > 0, probe -> 'in_force' ->> 'affinity' "
               "FROM runs ORDER BY 1")
    assert len(rows) == 4
    for fw, status, executor, env_id, tag, image_id, digest, acc, fast, sampled, affinity in rows:
        built = cpu_images[fw]
        assert (status, executor, acc, fast, sampled) == ("ok", "docker", True, True, True), fw
        assert env_id == f"{fw}-cpu-{recipe_hash(fw, 'cpu')[:12]}"
        assert (tag, image_id) == (built.tag, built.image_id)
        assert digest == built.image_id  # built here, never pushed: the image ID is its digest
        assert json.loads(affinity) == [0]
    # The bundle keeps what the engine said about the container.
    bundles = list((tmp_path / "results" / name).glob("*/*/container.json"))
    assert len(bundles) == 4
    for path in bundles:
        record = json.loads(path.read_text())
        assert record["oom_killed"] is False and record["exit_code"] == 0 and record["cpuset_cpus"] == "0"
    # provenance joins the image the run used with what `matrun build` recorded about it.
    prov = sql(tmp_path / "matrun.duckdb", "SELECT framework, image_tag FROM provenance ORDER BY 1")
    assert prov == sorted((fw, cpu_images[fw].tag) for fw in cpu_images)
    assert containers_of(docker_client, name) == []
    again = matrun("sweep", cwd=tmp_path)
    assert "0 runs (nothing to run); 4 already done" in again.stdout


@pytest.mark.slow
def test_a_cell_over_its_memory_limit_is_recorded_as_oom(tmp_path, docker_client, cpu_images):
    name = write_matrix(tmp_path, 'memory_limit = "48m"\n')
    proc = matrun("sweep", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "1 runs (1 oom)" in proc.stdout
    (status, tail), = sql(tmp_path / "matrun.duckdb", "SELECT status, error_tail FROM runs")
    assert status == "oom" and "OOM killer" in tail
    assert containers_of(docker_client, name) == []


@pytest.mark.slow
def test_sigterm_mid_cell_stops_the_container_and_keeps_finished_runs(tmp_path, docker_client, cpu_images):
    # Two cells: a short one that finishes, then a long one interrupted mid-run.
    name = write_matrix(tmp_path, '[[include]]\nsynthetic_train = 200000\nsynthetic_shape = [3, 64, 64]\n'
                                  'epochs = 50\n')
    sweep = subprocess.Popen([*MATRUN, "sweep"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            running = [c for c in containers_of(docker_client, name) if c.status == "running"]
            done = list((tmp_path / "results" / name).glob("*/*/result.json"))
            if running and done:
                break
            assert time.monotonic() < deadline and sweep.poll() is None, sweep.communicate()
            time.sleep(0.2)
        time.sleep(1.0)
        sweep.send_signal(signal.SIGTERM)
        out, err = sweep.communicate(timeout=90)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode != 0, (out, err)
    assert containers_of(docker_client, name) == []
    results = [json.loads(p.read_text()) for p in (tmp_path / "results" / name).glob("*/*/result.json")]
    assert sorted(r["status"] for r in results) == ["cancelled", "ok"]
    cancelled = next(r for r in results if r["status"] == "cancelled")
    assert cancelled["error_tail"] == "[matrun] the sweep was interrupted"
    # The finished run was ingested as it ended; the cancelled one is picked up by the next
    # sweep's catch-up, before that sweep runs the long cell again (filtered out here).
    assert sql(tmp_path / "matrun.duckdb", "SELECT status FROM runs") == [("ok",)]
    matrun("sweep", "--where", "epochs=1", cwd=tmp_path)
    statuses = sorted(row[0] for row in sql(tmp_path / "matrun.duckdb", "SELECT status FROM runs"))
    assert statuses == ["cancelled", "ok"]


def test_memory_limit_is_refused_on_the_local_executor(tmp_path):
    write_matrix(tmp_path, 'memory_limit = "1g"\n')
    proc = matrun("sweep", "--executor", "local", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "sets memory_limit, which the local executor cannot enforce; run it with --executor docker" in proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("result.json"))


def test_an_image_only_variant_is_refused_on_the_local_executor(tmp_path):
    write_matrix(tmp_path, 'variant = "cpu-openblas"\n')
    proc = matrun("sweep", "--executor", "local", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "variant cpu-openblas of torch is image-only" in proc.stderr
    assert "--executor docker" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--image", "torch"], "--image 'torch': expected FRAMEWORK:VARIANT, e.g. torch:cpu"),
    (["--image", "torch:rocm"], "framework torch has no variant 'rocm'"),
    (["--image", "../../etc:cpu"], "unknown framework '../../etc'"),
    (["--image", "torch:cpu;rm -rf /"], "framework torch has no variant 'cpu;rm -rf /'"),
    (["--image", "torch:cpu", "--wheelhouse", "/nonexistent/wheels"], "wheelhouse /nonexistent/wheels is not a directory"),
    (["--image", "torch:cpu", "--ca-bundle", "/nonexistent/ca.crt"], "CA bundle /nonexistent/ca.crt is not a file"),
])
def test_bad_build_requests_get_a_clear_error(tmp_path, args, message, docker_client):
    proc = matrun("build", *args, "--warehouse", str(tmp_path / "w.duckdb"), cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_build_without_an_engine_says_how_to_get_one(tmp_path):
    missing = f"unix://{tmp_path}/none.sock"
    proc = matrun("build", "--image", "torch:cpu", cwd=tmp_path, check=False, env={"DOCKER_HOST": missing})
    assert proc.returncode == 1
    assert f"no Docker engine: {tmp_path}/none.sock does not exist" in proc.stderr
    status = matrun("engine", "status", cwd=tmp_path, check=False, env={"DOCKER_HOST": missing})
    assert status.returncode == 1 and f"no Docker engine answers at {missing}" in status.stdout


@pytest.mark.slow
def test_build_records_the_images_and_images_lists_them(tmp_path, docker_client, cpu_images):
    db = tmp_path / "w.duckdb"
    proc = matrun("build", "--image", "torch:cpu", "--image", "mxnet:cpu", "--base-image", "matrun-base:bookworm",
                  "--warehouse", str(db), cwd=tmp_path)
    assert "torch:cpu: already built" in proc.stderr and "probe" in proc.stderr
    rows = sql(db, "SELECT tag, image_id, framework, blas, onednn, python, size_bytes > 0, "
                   "pins ->> 'torch' FROM images ORDER BY framework DESC")
    assert [r[:3] for r in rows] == [(cpu_images["torch"].tag, cpu_images["torch"].image_id, "torch"),
                                     (cpu_images["mxnet"].tag, cpu_images["mxnet"].image_id, "mxnet")]
    torch_row, mxnet_row = rows
    assert torch_row[3] == "mkl" and torch_row[4][0].isdigit() and torch_row[5].startswith("3.11")
    assert torch_row[6] is True and torch_row[7] == "2.13.0"
    assert mxnet_row[3].startswith("openblas") and mxnet_row[4] == "present"
    listed = matrun("images", "--warehouse", str(db), cwd=tmp_path).stdout
    assert cpu_images["torch"].tag in listed and cpu_images["mxnet"].tag in listed
    # Recording again (an image found already built) keeps one row per tag.
    matrun("build", "--image", "torch:cpu", "--base-image", "matrun-base:bookworm", "--no-probe",
           "--warehouse", str(db), cwd=tmp_path)
    assert sql(db, "SELECT count(*), count(blas) FROM images WHERE framework = 'torch'") == [(1, 1)]


def test_an_edited_recipe_is_not_run_in_the_old_image(monkeypatch, docker_client, cpu_images):
    # The executor looks images up by recipe hash: after an edit of the Dockerfile, pins or build
    # arguments, the old image is not used (and the cells get new ids through env_id).
    from matrun.errors import EnvironmentBuildError
    from matrun.runner.executors import docker as docker_executor

    monkeypatch.setattr(docker_executor, "recipe_hash", lambda fw, variant: "e" * 64)
    executor = docker_executor.DockerExecutor(docker_client)
    assert executor.env_id("torch", "cpu") == "torch-cpu-eeeeeeeeeeee"
    with pytest.raises(EnvironmentBuildError) as err:
        executor.image("torch", "cpu")
    assert str(err.value) == ("no image for torch:cpu built from the current recipe (images/torch/, recipe "
                              "eeeeeeeeeeee) in the Docker engine; build it with `matrun build` (or pick "
                              "--executor local)")


@pytest.mark.slow
def test_tune_runs_each_trial_in_a_container_of_the_image(tmp_path, docker_client, cpu_images):
    """`matrun tune --executor docker` (the matrix's executor here): every trial a docker run of
    the built image, recorded as a sweep's run is; no container left."""
    name = write_matrix(tmp_path, '[axes]\nlayout = ["nchw", "nhwc"]\nprecision = ["fp32", "bf16"]\n')
    doc = json.loads(matrun("tune", "--budget", "3", "--no-confirm", "--format", "json", cwd=tmp_path).stdout)
    assert doc["runs"] == 3 and doc["answer"][0]["framework"] == "torch"
    rows = sql(tmp_path / "matrun.duckdb", "SELECT executor, image_tag, status FROM runs")
    assert sorted(rows) == [("docker", cpu_images["torch"].tag, "ok")] * 3
    trials = sql(tmp_path / "matrun.duckdb", "SELECT kind, runs FROM tuning_trials ORDER BY trial")
    assert trials[0] == ("default", 1) and sum(r for _, r in trials) == 3
    assert containers_of(docker_client, name) == []
