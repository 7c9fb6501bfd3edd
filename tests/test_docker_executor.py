"""The Docker executor: the exact container a cell gets (GPU device requests included), the
cgroup reader on both layouts, and real cells in real containers of the built torch image
that succeed, run out of memory, time out, crash and are cancelled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from matrun.warehouse.bundles.layout import EVENTS, MONITOR, SPEC, STDERR, STDOUT
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.runner.executors.protocol import RunRequest
from matrun.runner.executors.docker import (COMPILE_CACHE_MOUNT, COMPILE_CACHE_VARIABLE, CONTAINER_JSON, HARNESS_MOUNT,
                                            CellLabels, DockerExecutor, ImageRef, cell_user, compile_cache,
                                            container_kwargs)
from matrun.runner.planning.matrix import parse_matrix
from matrun.runner.executors.monitor_cgroup import CgroupMonitor, find_cgroup, read_cpu_seconds, read_memory

from conftest import built_image

TINY = {"dataset": "synthetic", "synthetic_train": 256, "synthetic_test": 128,
        "batch_size": 32, "epochs": 1, "warmup_steps": 2, "threads": 1}
IMAGE = ImageRef(tag="matrun/torch:cpu-0123456789ab", image_id="sha256:" + "a" * 64, repo_digests=(),
                 content_hash="0123456789ab" + "0" * 52,
                 env=("PATH=/opt/venv/bin:/usr/bin:/bin", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1",
                      "OMP_NUM_THREADS=64"))


def params(**overrides) -> dict:
    (cell,) = parse_matrix({"fixed": {**TINY, **overrides}}, path=Path("matrix.toml")).cells
    return dict(cell.values)


# --- what a cell's container is started with (no engine needed) ------------------------------

def test_cpu_cell_container_is_exact(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    kwargs = container_kwargs(params(threads=2, seed=7, cpuset="0-1"), image=IMAGE, run_dir=tmp_path / "run",
                              data_dir=data, stage=Path("/stage/abc"), labels=CellLabels("s", "c" * 16, "0-1"),
                              user="65534:65534", memory_limit="2g")
    run = str(tmp_path / "run")
    assert kwargs == {
        "image": IMAGE.image_id,
        # the cell's lease is its stdin (runner/harness/lease.py), held by the executor
        "command": ["python3", "-m", "matrun.runner.harness", "--spec", f"{run}/spec.json", "--out", run,
                    "--lease-fd", "0"],
        "environment": {
            "PATH": "/opt/venv/bin:/usr/bin:/bin", "HOME": "/tmp",
            "PYTHONPATH": HARNESS_MOUNT, "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "7",
            "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "BLIS_NUM_THREADS": "2",
            "VECLIB_MAXIMUM_THREADS": "2", "NUMEXPR_NUM_THREADS": "2",
        },
        "working_dir": run,
        "user": "65534:65534",
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=1g"},
        "shm_size": "1g",
        "volumes": {"/stage/abc": {"bind": HARNESS_MOUNT, "mode": "ro"},
                    run: {"bind": run, "mode": "rw"},
                    str(data): {"bind": str(data), "mode": "ro"}},
        "labels": {"matrun.sweep": "s", "matrun.cell": "c" * 16, "matrun.run": "0-1", "matrun.role": "cell"},
        "stdin_open": True,  # OpenStdin + StdinOnce: closed by the engine when the executor's attachment ends
        "cpuset_cpus": "0,1",
        "mem_limit": "2g",
        "memswap_limit": "2g",
    }


def test_a_container_started_by_a_slurm_task_carries_its_job_id(tmp_path):
    """The label the nodes' Slurm epilog removes a SIGKILLed task's container by."""
    kwargs = container_kwargs(params(), image=IMAGE, run_dir=tmp_path, data_dir=tmp_path / "none",
                              stage=Path("/stage"), labels=CellLabels("s", "c", "0-1", "4711", "hpc"),
                              user="1000:1000")
    assert kwargs["labels"] == {"matrun.sweep": "s", "matrun.cell": "c", "matrun.run": "0-1",
                                "matrun.role": "cell", "matrun.slurm_job": "4711",
                                "matrun.slurm_cluster": "hpc"}


def test_gpu_cell_sends_a_device_request_and_names_its_gpus(tmp_path):
    """No GPU here: this is exactly what a 2-GPU cell would send to the engine."""
    import docker

    kwargs = container_kwargs(params(device="gpu", variant="cuda", gpus=2, threads=4, cpuset="1"), image=IMAGE,
                              run_dir=tmp_path, data_dir=tmp_path / "none", stage=Path("/stage"),
                              labels=CellLabels("s", "c", "0-1"), user="1000:1000")
    assert kwargs["device_requests"] == [docker.types.DeviceRequest(count=2, capabilities=[["gpu"]])]
    assert kwargs["device_requests"][0] == {"Driver": "", "Count": 2, "DeviceIDs": [],
                                            "Capabilities": [["gpu"]], "Options": {}}
    assert kwargs["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert kwargs["environment"]["OMP_NUM_THREADS"] == "4"
    assert kwargs["cpuset_cpus"] == "1"
    assert "mem_limit" not in kwargs and str(tmp_path / "none") not in kwargs["volumes"]


def test_gpu_cell_with_gpu_ids_asks_for_those_devices(tmp_path):
    p = {**params(device="gpu", variant="cuda", gpus=2), "gpu_ids": [2, 3]}
    kwargs = container_kwargs(p, image=IMAGE, run_dir=tmp_path, data_dir=tmp_path, stage=Path("/stage"),
                              labels=CellLabels("s", "c", "0-1"), user="1000:1000")
    assert kwargs["device_requests"][0] == {"Driver": "", "Count": 0, "DeviceIDs": ["2", "3"],
                                            "Capabilities": [["gpu"]], "Options": {}}


def test_cpu_cell_sends_no_device_request(tmp_path):
    kwargs = container_kwargs(params(), image=IMAGE, run_dir=tmp_path, data_dir=tmp_path, stage=Path("/s"),
                              labels=CellLabels("s", "c", "0-1"), user="1000:1000")
    assert "device_requests" not in kwargs and "cpuset_cpus" not in kwargs
    assert "CUDA_VISIBLE_DEVICES" not in kwargs["environment"]


def test_a_theano_cell_gets_its_images_compile_cache_and_no_other_framework_does(tmp_path, monkeypatch):
    """framework.toml's compile_cache (Theano's only): one folder per (image, user) under
    $MATRUN_HOME, the user's own, mounted read-write where the harness is told to look
    (runner/harness/adapters/theano.py reads the same variable)."""
    from matrun.frameworks import frameworks

    assert [name for name, fw in frameworks().items() if fw.compile_cache] == ["theano"]
    from matrun.runner.harness.adapters import theano as theano_adapter

    monkeypatch.setenv("MATRUN_HOME", str(tmp_path / "home"))
    assert theano_adapter.CACHE_VARIABLE == COMPILE_CACHE_VARIABLE
    assert compile_cache(params(), IMAGE, "1000:1000") is None  # torch
    me = f"{os.geteuid()}:{os.getegid()}"
    cache = compile_cache(params(framework="theano"), IMAGE, me)
    assert cache == tmp_path / "home" / "compile" / "theano" / f"{'a' * 16}-{os.geteuid()}"
    st = cache.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (os.geteuid(), os.getegid(), 0o700)
    other = ImageRef(**{**vars(IMAGE), "image_id": "sha256:" + "b" * 64})
    assert compile_cache(params(framework="theano"), other, me) != cache  # an image of its own
    if os.geteuid() == 0:  # root hands a root-owned bundle's cell (nobody) a folder nobody owns
        nobody = compile_cache(params(framework="theano"), IMAGE, "65534:65534")
        assert nobody.name == f"{'a' * 16}-65534" and (nobody.stat().st_uid, nobody.stat().st_gid) == (65534, 65534)
    kwargs = container_kwargs(params(framework="theano"), image=IMAGE, run_dir=tmp_path, data_dir=tmp_path,
                              stage=Path("/s"), labels=CellLabels("s", "c", "0-1"), user=me, compile_cache=cache)
    assert kwargs["volumes"][str(cache)] == {"bind": COMPILE_CACHE_MOUNT, "mode": "rw"}
    assert kwargs["environment"][COMPILE_CACHE_VARIABLE] == COMPILE_CACHE_MOUNT
    plain = container_kwargs(params(), image=IMAGE, run_dir=tmp_path, data_dir=tmp_path, stage=Path("/s"),
                             labels=CellLabels("s", "c", "0-1"), user=me)
    assert COMPILE_CACHE_VARIABLE not in plain["environment"]
    assert all(v["bind"] != COMPILE_CACHE_MOUNT for v in plain["volumes"].values())


def test_a_compile_cache_folder_that_cannot_be_made_leaves_the_cell_compiling_in_its_run(tmp_path, monkeypatch):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the folder would go")
    monkeypatch.setenv("MATRUN_HOME", str(blocker))
    assert compile_cache(params(framework="theano"), IMAGE, f"{os.geteuid()}:{os.getegid()}") is None


def test_cell_user_is_the_bundle_owner_or_nobody(tmp_path):
    owned = tmp_path / "owned"
    owned.mkdir()
    if os.geteuid() == 0:
        assert cell_user(tmp_path) == "65534:65534"
        os.chown(owned, 1234, 2345)
        assert cell_user(owned) == "1234:2345"
    else:
        assert cell_user(owned) == f"{os.getuid()}:{os.getgid()}"


# --- the cgroup reader, on fake trees of both layouts ----------------------------------------

CID = "f" * 64


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_systemd_layout(tmp_path):
    _write(tmp_path / "cgroup.controllers", "cpu memory\n")
    d = tmp_path / "system.slice" / f"docker-{CID}.scope"
    _write(d / "cpu.stat", "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n")
    _write(d / "memory.current", "500\n")
    _write(d / "memory.peak", "900\n")
    _write(d / "memory.stat", "anon 300\ninactive_file 100\n")
    paths = find_cgroup(CID, tmp_path)
    assert paths is not None and paths.version == 2 and paths.cpu == d
    assert read_cpu_seconds(paths) == (2.0, 1.0)
    assert read_memory(paths) == (400, 500, 900)


def _v1_tree(root: Path) -> tuple[Path, Path]:
    """A running container's cgroup v1 (cgroupfs) directories: (cpuacct, memory)."""
    cpu, mem = root / "cpuacct" / "docker" / CID, root / "memory" / "docker" / CID
    _write(cpu / "cpuacct.usage_user", "1500000000\n")
    _write(cpu / "cpuacct.usage_sys", "500000000\n")
    _write(cpu / "cgroup.procs", "4242\n")
    _write(mem / "memory.usage_in_bytes", "1000\n")
    _write(mem / "memory.max_usage_in_bytes", "4000\n")
    _write(mem / "memory.stat", "cache 10\ntotal_inactive_file 200\n")
    return cpu, mem


def test_cgroup_v1_cgroupfs_layout(tmp_path):
    cpu, mem = _v1_tree(tmp_path)
    paths = find_cgroup(CID, tmp_path)
    assert paths is not None and paths.version == 1 and (paths.cpu, paths.memory) == (cpu, mem)
    assert read_cpu_seconds(paths) == (1.5, 0.5)
    assert read_memory(paths) == (800, 1000, 4000)
    (cpu / "cpuacct.usage_user").unlink()  # the container exited
    assert read_cpu_seconds(paths) is None


def test_monitor_stops_sampling_once_the_cgroup_has_no_process(tmp_path):
    """The cgroup outlives its processes for a moment: a sample read then (no process, memory
    already freed) is not a sample of the run and must not be recorded."""
    cpu, mem = _v1_tree(tmp_path)
    out = tmp_path / "monitor.jsonl"
    monitor = CgroupMonitor(CID, out, interval_s=0.02, root=tmp_path).start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(out.read_text().splitlines() if out.exists() else []) < 4:
        time.sleep(0.02)
    (cpu / "cgroup.procs").write_text("")  # the last process exited; then its memory is freed
    (mem / "memory.usage_in_bytes").write_text("0\n")
    monitor._thread.join(timeout=5)
    assert not monitor._thread.is_alive()  # it ended by itself, not by stop()
    aggregates = monitor.stop()
    samples = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert len(samples) >= 3 and aggregates["samples"] == len(samples)
    assert all(s["nprocs"] == 1 and s["rss_bytes"] == 800 for s in samples)


def test_no_cgroup_for_an_unknown_container(tmp_path):
    (tmp_path / "memory").mkdir()
    assert find_cgroup(CID, tmp_path) is None


# --- real containers -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(docker_client):
    return docker_client


@pytest.fixture(scope="module")
def executor(client) -> DockerExecutor:
    built_image(client, "torch", "cpu")
    return DockerExecutor(client)


def write_spec(run_dir: Path, p: dict, data_dir: Path, sweep: str) -> None:
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / SPEC, {"schema_version": 1, "sweep": sweep, "cell_id": "c" * 16, "repeat": 0,
                                       "attempt": 1, "env_id": "e", "data_dir": str(data_dir), "params": p})


def run_cell(executor: DockerExecutor, tmp_path: Path, p: dict, *, timeout: float = 120.0,
             data_dir: Path = Path("/nonexistent")):
    sweep = f"test-{uuid.uuid4().hex[:12]}"
    run_dir = tmp_path / "bundle"
    write_spec(run_dir, p, data_dir, sweep)
    outcome = executor.run(RunRequest(run_dir=run_dir, params=p, env_id="e", timeout=timeout, data_dir=data_dir))
    return outcome, run_dir, sweep


def containers_of(client, sweep: str) -> list:
    # sparse: the list as the engine gives it, without inspecting each container (one removed in
    # between would raise NotFound)
    return client.containers.list(all=True, sparse=True, filters={"label": f"matrun.sweep={sweep}"})


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / EVENTS).read_text().splitlines()]


@pytest.mark.slow
def test_real_cell_runs_ok_with_cgroup_samples_and_the_image(tmp_path, client, executor):
    outcome, run_dir, sweep = run_cell(executor, tmp_path, params(cpuset="0", epochs=2))
    assert outcome.status == "ok", outcome.error_tail
    assert outcome.exit_code == 0 and outcome.error_tail == ""
    ref = executor.image("torch", "cpu")
    assert outcome.image == ref.as_record() and outcome.image["id"].startswith("sha256:")
    recorded = json.loads((run_dir / CONTAINER_JSON).read_text())
    assert recorded["image"] == ref.as_record()
    assert recorded["user"] == ("65534:65534" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}")
    assert recorded["cpuset_cpus"] == "0" and recorded["oom_killed"] is False
    probe = next(e for e in events(run_dir) if e["type"] == "probe")
    assert probe["in_force"]["affinity"] == [0] and probe["in_force"]["threads"] == 1
    assert probe["mismatches"] == []
    lines = (run_dir / MONITOR).read_text().splitlines()
    header = json.loads(lines[0])
    assert header["container"] == outcome.container_id and header["cgroup"]
    samples = [json.loads(line) for line in lines[1:]]
    assert len(samples) >= 3 and all(s["rss_bytes"] > 0 and s["nprocs"] >= 1 for s in samples)
    assert outcome.monitor["samples"] == len(samples)
    assert 0 < outcome.monitor["cpu_total_avg"] <= 110  # pinned to one CPU
    assert outcome.monitor["cgroup_memory_peak_bytes"] >= outcome.monitor["rss_peak_bytes"]
    assert containers_of(client, sweep) == []
    assert all(p.stat().st_uid == run_dir.stat().st_uid for p in run_dir.iterdir())


@pytest.mark.slow
def test_cell_over_its_memory_limit_is_oom(tmp_path, client, executor):
    outcome, run_dir, sweep = run_cell(executor, tmp_path, params(memory_limit="48m"))
    assert outcome.status == "oom", outcome.error_tail
    assert "OOM killer" in outcome.error_tail
    assert json.loads((run_dir / CONTAINER_JSON).read_text())["oom_killed"] is True
    assert containers_of(client, sweep) == []


@pytest.mark.slow
def test_timeout_kills_and_removes_the_container(tmp_path, client, executor):
    big = params(synthetic_train=200_000, synthetic_shape=[3, 64, 64], epochs=50)
    outcome, run_dir, sweep = run_cell(executor, tmp_path, big, timeout=4)
    assert outcome.status == "timeout"
    assert "killed after the cell's timeout of 4 s" in outcome.error_tail
    # killed at its timeout, not before; the bound only says it did not run on (the cell alone would take many minutes)
    assert 4 <= outcome.wall_seconds < 120
    assert containers_of(client, sweep) == []


@pytest.mark.slow
def test_crash_is_failed_with_the_container_logs_in_the_bundle(tmp_path, client, executor):
    empty = tmp_path / "empty"
    empty.mkdir()
    # no oneDNN check: its verbose run would only fail on the missing data first, the same way
    outcome, run_dir, sweep = run_cell(executor, tmp_path, params(dataset="mnist", onednn_check=False),
                                       data_dir=empty)
    assert outcome.status == "failed"
    assert outcome.exit_code not in (0, None)
    stderr = (run_dir / STDERR).read_text()
    assert "mnist" in stderr and stderr.strip() in outcome.error_tail
    assert "[matrun] exit code" in outcome.error_tail
    assert (run_dir / STDOUT).exists()
    assert containers_of(client, sweep) == []


_CANCEL_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from matrun.runner.executors.protocol import RunRequest
    from matrun.runner.executors.docker import DockerExecutor
    run_dir, p = Path(sys.argv[1]), json.loads(sys.argv[2])
    try:
        DockerExecutor().run(RunRequest(run_dir=run_dir, params=p, env_id="e", timeout=300,
                                        data_dir=Path("/nonexistent")))
    except KeyboardInterrupt:
        print("interrupted")
        raise
""")


@pytest.mark.slow
def test_ctrl_c_mid_cell_leaves_no_container(tmp_path, client, executor):
    p = params(synthetic_train=200_000, synthetic_shape=[3, 64, 64], epochs=50)
    sweep = f"test-{uuid.uuid4().hex[:12]}"
    run_dir = tmp_path / "bundle"
    write_spec(run_dir, p, Path("/nonexistent"), sweep)
    proc = subprocess.Popen([sys.executable, "-c", _CANCEL_SCRIPT, str(run_dir), json.dumps(p)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(c.status == "running" for c in containers_of(client, sweep)):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # mid-cell
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "interrupted" in out and "KeyboardInterrupt" in err
    assert containers_of(client, sweep) == []
    assert (run_dir / STDERR).exists()
