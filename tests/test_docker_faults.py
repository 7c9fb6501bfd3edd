"""The docker executor under faults, for real (issue 11).  kill -9 of a sweep and the
containers it leaves: tests/test_docker_orphans.py.

- The Docker engine stopped mid-cell and left down: the run is recorded `failed` ("the Docker
  engine at … stopped answering mid-cell") and the sweep stops with an `Error:` line (exit 1)
  within its grace period, no traceback; once the engine is back the next sweep removes the
  container it kept.  The engine restarted mid-cell: that run is failed with a note, the sweep
  goes on and the next cell runs ok.  These use a private engine of this module's own (its own
  socket, state and data root, the mxnet image loaded into it), never the shared one.
- The engine gone between two cells, refusing the container, the image removed between plan and
  run, the container killed or removed from outside mid-cell: a recorded status with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from matrun.runner.environments import engine
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.outcomes import RunAborted
from matrun.runner.executors.protocol import RunRequest
from matrun.runner.planning.matrix import parse_matrix
from matrun.warehouse.bundles.layout import SPEC, STDERR
from matrun.warehouse.bundles.write import write_json_atomic

from conftest import built_image
from test_sweep import sql

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
# No oneDNN check (the harness's second, verbose run of the cell): the faults here are the engine's
# and the container's, and no test looks at what the check finds (tests/test_harness.py does).
TINY = {"dataset": "synthetic", "synthetic_train": 256, "synthetic_test": 128, "batch_size": 32, "epochs": 1,
        "warmup_steps": 2, "threads": 1, "cpuset": "0", "onednn_check": False}
# minutes of training: always stopped before its end
LONG = {"synthetic_train": 200_000, "synthetic_shape": [3, 64, 64], "epochs": 50}


def params(**overrides) -> dict:
    (cell,) = parse_matrix({"fixed": {**TINY, **overrides}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


def labelled(client, sweep: str) -> list:
    # sparse: the list as the engine gives it, without inspecting each container (one removed in
    # between would raise NotFound)
    return client.containers.list(all=True, sparse=True, filters={"label": f"matrun.sweep={sweep}"})


def wait_for(predicate, what: str, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def write_matrix(tmp_path: Path, body: str, *, drop: tuple[str, ...] = ()) -> str:
    """A docker sweep of the tiny cell, ``body`` appended to its ``[fixed]`` (``drop``: keys of the
    tiny cell left out, for an axis of ``body``)."""
    name = f"f{uuid.uuid4().hex[:10]}"
    fixed = "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items() if k not in drop)
    (tmp_path / "matrix.toml").write_text(f'[sweep]\nname = "{name}"\nexecutor = "docker"\n'
                                          f'[fixed]\n{fixed}{body}')
    return name


def start_sweep(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    # its own session: the process group is killed as a whole
    return subprocess.Popen([*MATRUN, "sweep", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            start_new_session=True)


def results(tmp_path: Path, name: str) -> dict[str, dict]:
    """result.json of every run directory, by "<cell>/<repeat>-<attempt>"."""
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text())
            for p in (tmp_path / "results" / name).glob("*/*/result.json")}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- the shared engine, the torch image -------------------------------------------------------

@pytest.fixture(scope="module")
def torch_ready(docker_client):
    built_image(docker_client, "torch", "cpu")
    return docker_client


CELL = "c" * 16


def write_spec(run_dir: Path, p: dict, sweep: str) -> None:
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / SPEC, {"schema_version": 1, "sweep": sweep, "cell_id": CELL, "repeat": 0,
                                       "attempt": 1, "env_id": "e", "data_dir": "/nonexistent", "params": p})


# --- faults of the engine and of the container, one executor call each ------------------------

def run_cell(executor: DockerExecutor, tmp_path: Path, p: dict, *, timeout: float = 120.0, sweep: str = ""):
    sweep = sweep or f"fault-{uuid.uuid4().hex[:10]}"
    run_dir = tmp_path / sweep / CELL / "0-1"
    write_spec(run_dir, p, sweep)
    outcome = executor.run(RunRequest(run_dir=run_dir, params=p, env_id="e", timeout=timeout,
                                      data_dir=Path("/nonexistent")))
    return outcome, run_dir, sweep


def meddle_once_running(client, sweep: str, action) -> threading.Thread:
    """In the background: once the sweep's container runs (2 s into it), ``action(container)``."""
    def go():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = client.containers.list(filters={"label": f"matrun.sweep={sweep}"})
            if running:
                time.sleep(2.0)
                action(running[0])
                return
            time.sleep(0.1)
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "remove"])
def test_a_container_killed_or_removed_from_outside_is_a_failed_run(tmp_path, torch_ready, how):
    client = torch_ready
    sweep = f"fault-{uuid.uuid4().hex[:10]}"
    thread = meddle_once_running(client, sweep, lambda c: c.kill() if how == "kill" else c.remove(force=True))
    outcome, run_dir, _ = run_cell(DockerExecutor(client), tmp_path, params(**LONG), timeout=300, sweep=sweep)
    thread.join(timeout=10)
    assert outcome.status == "failed" and outcome.wall_seconds < 120, outcome
    killed = ("[matrun] killed by SIGKILL (from outside the cell: `docker kill`, `docker rm -f`, or the host's "
              "OOM killer; the engine reports no OOM kill of the container)")
    if how == "kill":
        assert outcome.exit_code == 137 and outcome.error_tail.endswith(killed)
    else:  # the engine kills, then removes: the run ends on either
        assert outcome.error_tail.endswith(killed) or outcome.error_tail.endswith(
            "[matrun] the cell's container was removed mid-cell from outside matrun (docker rm -f?); "
            "its logs went with it")
    assert labelled(client, sweep) == []
    assert (run_dir / STDERR).exists()


@pytest.mark.slow
def test_the_engine_refusing_the_container_and_an_image_removed_before_the_run_are_failed_runs(tmp_path, torch_ready):
    client = torch_ready
    executor = DockerExecutor(client)
    # the engine refuses CPUs this host does not have (a cell planned for a bigger node)
    outcome, run_dir, sweep = run_cell(executor, tmp_path, params(cpuset="63"))
    assert outcome.status == "failed"
    assert outcome.error_tail.startswith("[matrun] the Docker engine did not start the cell's container: ")
    assert "63" in outcome.error_tail and labelled(client, sweep) == []
    # an image of its own (a copy of the torch image's config, labelled so no sweep picks it),
    # found when the sweep prepares, removed before its cell runs
    base = built_image(client, "torch", "cpu")
    tag = f"matrun-test/removed:{uuid.uuid4().hex[:10]}"
    scratch = client.containers.create(base.image_id, command=["true"], network_mode="none")
    try:
        repository, _, version = tag.partition(":")
        scratch.commit(repository=repository, tag=version, changes=["LABEL org.matrun.recipe-hash=removed-test"])
    finally:
        scratch.remove(force=True)
    doomed = DockerExecutor(client, images={("torch", "cpu"): tag})
    doomed.prepare({("torch", "cpu")}, log=lambda text: None)
    client.images.remove(tag, force=True)
    outcome, run_dir, sweep = run_cell(doomed, tmp_path, params())
    assert outcome.status == "failed"
    assert "the Docker engine did not start the cell's container" in outcome.error_tail
    assert "No such image" in outcome.error_tail or "not found" in outcome.error_tail.lower()
    assert outcome.image["tag"] == tag and labelled(client, sweep) == []


# --- the Docker engine lost: a private engine of this module's own ------------------------------

class PrivateEngine:
    """A dockerd of the tests' own: its socket, state and data root under a short /tmp path."""

    def __init__(self) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="mtf-", dir="/tmp"))
        self.socket = self.state / "d.sock"
        self.url = f"unix://{self.socket}"
        self.pid_file = self.state / "dockerd.pid"

    def start(self) -> None:
        engine.start_engine(state_dir=self.state, socket=str(self.socket), private=True)

    def stop(self) -> None:
        engine.stop_engine(self.pid_file)

    def client(self):
        return engine.connect(self.url)


@pytest.fixture(scope="module")
def private_engine(docker_client):
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("a private Docker engine needs root and Debian's docker.io")
    image = built_image(docker_client, "mxnet", "cpu")
    eng = PrivateEngine()
    try:
        eng.start()
        # slow clients: a busy machine takes more than the usual 10 s to copy 600 MB across
        source = engine.connect(timeout=600).images.get(image.image_id)
        engine.connect(eng.url, timeout=600).images.load(source.save(chunk_size=1 << 20))
        repository, _, version = image.tag.partition(":")
        eng.client().images.get(image.image_id).tag(repository, version)
        yield eng
    finally:
        eng.stop()
        shutil.rmtree(eng.state, ignore_errors=True)


def mxnet_matrix(tmp_path: Path) -> str:
    """Two cells, in this order: a long one (minutes: stopped with the engine), a tiny one."""
    return write_matrix(tmp_path, 'framework = "mxnet"\n[axes]\nsynthetic_train = [200000, 256]\n',
                        drop=("synthetic_train",))


@pytest.mark.slow
def test_the_engine_stopped_mid_cell_fails_the_run_and_stops_the_sweep_with_an_error(tmp_path, private_engine):
    eng = private_engine
    name = mxnet_matrix(tmp_path)
    env = {"DOCKER_HOST": eng.url}
    sweep = start_sweep(tmp_path, env=env)
    try:
        wait_for(lambda: [c for c in labelled(eng.client(), name) if c.status == "running"], "running container",
                 120, sweep)
        time.sleep(1.0)
        eng.stop()  # SIGTERM to that dockerd, which stops its containers, and left down
        out, err = sweep.communicate(timeout=120)  # a sweep that waited forever fails here
    finally:
        stop(sweep)
        if engine.find_engine(eng.url) is None:
            eng.start()
    assert sweep.returncode == 1, out + err
    assert "Traceback" not in err
    assert f"Error: the Docker engine at {eng.url} stopped answering mid-cell" in err
    assert "did not answer again within 30 s: the run is recorded failed and the sweep stops here" in err
    runs = results(tmp_path, name)
    (run,) = runs.values()  # the tiny cell was not tried: it would only have failed the same way
    assert run["status"] == "failed" and run["exit_code"] is None
    assert f"[matrun] the Docker engine at {eng.url} stopped answering mid-cell and did not answer again " \
           f"within 30 s" in run["error_tail"]
    assert sql(tmp_path / "matrun.duckdb", "SELECT status FROM runs") == [("failed",)]
    # The engine is back (the fixture's finally): it kept the container, which the next sweep removes
    # (the run is already recorded) before it runs the tiny cell.
    assert [c.status for c in labelled(eng.client(), name)] == ["exited"]
    again = subprocess.run([*MATRUN, "sweep", "--where", "synthetic_train=256"], cwd=tmp_path, capture_output=True,
                           text=True, env={**os.environ, **env})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "of a sweep that died" in again.stderr and "removed container" in again.stderr
    assert labelled(eng.client(), name) == []
    assert sorted(r["status"] for r in results(tmp_path, name).values()) == ["failed", "ok"]


@pytest.mark.slow
def test_the_engine_restarted_mid_cell_fails_that_run_and_the_sweep_goes_on(tmp_path, private_engine):
    eng = private_engine
    name = mxnet_matrix(tmp_path)
    sweep = start_sweep(tmp_path, env={"DOCKER_HOST": eng.url})
    try:
        wait_for(lambda: [c for c in labelled(eng.client(), name) if c.status == "running"], "running container",
                 120, sweep)
        time.sleep(1.0)
        eng.stop()
        eng.start()
        out, err = sweep.communicate(timeout=240)
    finally:
        stop(sweep)
        if engine.find_engine(eng.url) is None:
            eng.start()
    assert sweep.returncode == 1, out + err  # one run failed
    assert "Traceback" not in err and "Error:" not in err
    assert "2 runs (1 failed, 1 ok)" in out
    by_size = {json.loads((tmp_path / "results" / name / key / SPEC).read_text())["params"]["synthetic_train"]: r
               for key, r in results(tmp_path, name).items()}
    assert by_size[256]["status"] == "ok"
    lost = by_size[200000]
    assert lost["status"] == "failed"
    assert (f"[matrun] the Docker engine at {eng.url} stopped answering mid-cell and answered again"
            in lost["error_tail"])
    assert labelled(eng.client(), name) == []
    assert sorted(s for (s,) in sql(tmp_path / "matrun.duckdb", "SELECT status FROM runs")) == ["failed", "ok"]


@pytest.mark.slow
def test_the_engine_gone_before_a_cell_starts_aborts_with_the_run_recorded_failed(tmp_path, private_engine):
    eng = private_engine
    executor = DockerExecutor(docker_host=eng.url, engine_grace=3)
    executor.prepare({("mxnet", "cpu")}, log=lambda text: None)
    eng.stop()
    try:
        with pytest.raises(RunAborted) as aborted:
            run_cell(executor, tmp_path, params(framework="mxnet"))
    finally:
        eng.start()
    assert str(aborted.value).startswith(f"the Docker engine at {eng.url} stopped answering as the cell's "
                                         "container was created")
    outcome = aborted.value.outcome
    assert outcome.status == "failed" and "did not answer again within 3 s" in outcome.error_tail
