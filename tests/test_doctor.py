"""``matrun doctor`` on this host: the real engine up and down, the real Slurm test cluster up and
down, data, environments and images missing, GPU cells on this GPU-less host (NVML's real
answer) and, with a fake NVML inventory (no GPU exists here), the driver against each CUDA
image; the JSON document, the exit codes, malformed and hostile input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import slurm_missing
from typer.testing import CliRunner

from matrun.errors import EnvironmentBuildError
from matrun.frameworks import default_framework, get_framework
from matrun.runner.cli.main import app
from matrun.runner.doctor import checks as doctor_checks
from matrun.runner.doctor.checks import (
    DISK_FAIL_BYTES, STATUSES, cuda_checks, cuda_needed, disk_check, gpu_runtime_check, gpus_check,
)
from matrun.runner.doctor.report import doctor
from matrun.runner.environments.contexts import default_base_image, image_repository, recipe_hash
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.gpu import gpu_inventory
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.slurm.cluster import cluster_config_text, free_port

MATRUN = str(Path(sys.executable).with_name("matrun"))
NO_ENGINE = "unix:///nonexistent/matrun-test/docker.sock"
FW = default_framework()

CPU_MATRIX = """
[sweep]
name = "doc"
results = "results"
warehouse = "lake"
{sweep}

[fixed]
dataset = "{dataset}"
epochs = 1
{fixed}

[axes]
threads = [1, 2]
"""


def write(tmp_path: Path, *, dataset: str = "synthetic", sweep: str = "", fixed: str = "",
          name: str = "matrix.toml") -> Path:
    path = tmp_path / name
    path.write_text(CPU_MATRIX.format(dataset=dataset, sweep=sweep, fixed=fixed), encoding="utf-8")
    return path


def run(*args: str, env: dict[str, str | None] | None = None):
    """``matrun doctor ARGS`` in this process (CliRunner: stdout and stderr apart)."""
    return CliRunner().invoke(app, ["doctor", *args], env=env or {})


def as_json(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, dict]:
    result = run(*args, "--json", env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


def by_name(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def gpu_variant(major: int | None = None) -> str:
    """A GPU variant of the default framework (whose base image needs CUDA ``major``.x when given)."""
    for name, var in get_framework(FW).variants.items():
        if var.device == "gpu" and (major is None or (cuda_needed(default_base_image(FW, name)) or (0,))[0] == major):
            return name
    pytest.skip(f"the default framework has no GPU variant on CUDA {major}")


# --- the local executor: environments, data, CPUs, cells -------------------------------------------

def test_a_cpu_matrix_with_its_environment_built_can_run_locally(tmp_path, torch_env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "local")
    assert code == 0 and doc["ok"] is True and doc["failures"] == 0
    assert (doc["executor"], doc["cells"], doc["matrix"]) == ("local", 2, "matrix.toml")
    checks = by_name(doc)
    env = checks[f"environment {FW}:cpu"]
    if torch_env.spec.framework == FW:
        assert env == {"name": f"environment {FW}:cpu", "status": "ok",
                       "found": f"{torch_env.spec.env_id} built at {torch_env.path}", "fix": None}
    assert checks["executor"]["found"] == "executor: local"
    assert checks["data"]["status"] == "ok" and checks["cpus"]["status"] == "ok"
    assert "engine" not in checks and "slurm-client" not in checks  # not what the local executor needs
    assert checks["gpus"]["status"] == "ok" and checks["gpus"]["found"].startswith("no cell asks for a GPU")
    assert {"disk results", "disk warehouse", "machine"} <= set(checks)
    assert all(set(c) == {"name", "status", "found", "fix"} and c["status"] in STATUSES for c in doc["checks"])
    assert doc["warnings"] == sum(c["status"] == "warn" for c in doc["checks"])


def test_an_environment_not_built_is_a_warning_the_sweep_builds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "local", env={"MATRUN_HOME": str(tmp_path / "home")})
    env = by_name(doc)[f"environment {FW}:cpu"]
    assert code == 0 and doc["ok"] is True
    assert env["status"] == "warn" and str(tmp_path / "home" / "envs") in env["found"]
    assert env["fix"] == "matrun envs matrix.toml --build"
    assert not (tmp_path / "home" / "envs").exists()  # doctor builds nothing


def test_an_image_only_variant_has_no_environment_under_local(tmp_path, monkeypatch):
    only = next((n for n, v in get_framework(FW).variants.items() if v.requirements is None), None)
    if only is None:
        pytest.skip("the default framework has no image-only variant")
    monkeypatch.chdir(tmp_path)
    write(tmp_path, fixed=f'variant = "{only}"')
    result = run("--executor", "local")
    assert result.exit_code == 1
    assert f"FAIL  environment {FW}:{only}" in result.stdout and "is image-only" in result.stdout
    assert f"fix: run these cells with --executor docker (matrun build matrix.toml --where framework={FW} " \
           f"--where variant={only})" in result.stdout
    assert result.stderr == f"Error: 1 check(s) failed: environment {FW}:{only}\n"


def test_a_missing_dataset_fails_with_the_import_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "data dir"
    empty.mkdir()
    write(tmp_path, dataset="mnist", sweep=f'data_dir = "{empty}"')
    code, doc = as_json("--executor", "local")
    check = by_name(doc)["dataset mnist"]
    assert code == 1 and doc["ok"] is False
    assert check["status"] == "fail" and f"dataset directory not found: {empty / 'mnist'}" in check["found"]
    assert check["fix"] == f"matrun data import mnist PATH --data-dir '{empty}'"


def test_a_staged_dataset_is_ok(tmp_path, monkeypatch, fashion_mnist_root):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, dataset="fashion-mnist", sweep=f'data_dir = "{fashion_mnist_root}"')
    _, doc = as_json("--executor", "local")
    assert by_name(doc)["dataset fashion-mnist"] == {
        "name": "dataset fashion-mnist", "status": "ok", "found": f"staged in {fashion_mnist_root / 'fashion-mnist'}",
        "fix": None}


def test_cells_the_executor_cannot_run_and_cpus_this_host_lacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, fixed='memory_limit = "2g"\ncpuset = "4095"')
    code, doc = as_json("--executor", "local")
    checks = by_name(doc)
    assert code == 1 and checks["cells"]["status"] == "fail"
    assert "sets memory_limit, which the local executor cannot enforce" in checks["cells"]["found"]
    assert checks["cpus"]["status"] == "fail"
    assert "cpuset '4095' names CPUs this host does not offer" in checks["cpus"]["found"]
    write(tmp_path, fixed="nodes = 2\nworkers = 2")
    _, doc = as_json("--executor", "local")
    assert "nodes = 2: the local executor runs a cell on one host" in by_name(doc)["cells"]["found"]


# --- GPUs: NVML's real answer here, a fake inventory for a GPU host --------------------------------

def test_gpu_cells_fail_on_this_gpu_less_host_with_nvml_s_reason(tmp_path, monkeypatch):
    real = gpu_inventory()
    if real["available"]:
        pytest.skip("this host has an NVIDIA driver")
    monkeypatch.chdir(tmp_path)
    variant = gpu_variant()
    write(tmp_path, fixed=f'device = "gpu"\nvariant = "{variant}"')
    code, doc = as_json("--executor", "local")
    checks = by_name(doc)
    assert code == 1
    assert checks["gpus"]["status"] == "fail" and real["reason"] in checks["gpus"]["found"]
    assert "--where device=cpu" in checks["gpus"]["fix"]
    need = cuda_needed(default_base_image(FW, variant))
    assert checks[f"cuda {FW}:{variant}"]["status"] == "fail"
    assert checks[f"cuda {FW}:{variant}"]["found"].startswith(f"needs CUDA {need[0]}.{need[1]} ")


def fake_inventory(cuda: str, n: int = 2) -> dict:
    return {"available": True, "reason": None, "driver_version": "550.54.15", "cuda_driver_version": cuda,
            "gpus": [{"index": i, "uuid": f"GPU-{i}aaa", "name": "NVIDIA H200", "memory_total_bytes": 141 << 30,
                      "mig_mode": False, "ecc_mode": True} for i in range(n)]}


def test_the_driver_against_the_cuda_each_image_needs():
    variant = gpu_variant(13)
    base = default_base_image(FW, variant)
    (old,) = cuda_checks([(FW, variant)], fake_inventory("12.4"))
    assert old.status == "fail" and old.found == (
        f"needs CUDA 13.0 (base image {base}); the driver 550.54.15 supports CUDA up to 12.4")
    assert "update the NVIDIA driver" in old.fix
    (new,) = cuda_checks([(FW, variant)], fake_inventory("13.0"))
    assert new.status == "ok" and new.fix is None
    (newer,) = cuda_checks([(FW, variant)], fake_inventory("13.1"))
    assert newer.status == "ok" and newer.found.endswith("supports CUDA up to 13.1")
    assert cuda_needed("nvidia/cuda:12.9.1-base-ubuntu24.04") == (12, 9)
    assert cuda_needed("registry.example/nvidia/cuda:11.7.1-cudnn8-runtime") == (11, 7)
    assert cuda_needed("debian:bookworm-20240926-slim") is None


def test_an_older_minor_cuda_is_a_warning(monkeypatch):
    variant = gpu_variant(13)
    monkeypatch.setattr(doctor_checks, "default_base_image", lambda fw, v: "nvidia/cuda:13.2.0-base-ubuntu24.04")
    (check,) = cuda_checks([(FW, variant)], fake_inventory("13.0"))
    assert check.status == "warn" and "minor-version compatibility" in check.found
    monkeypatch.setattr(doctor_checks, "default_base_image", lambda fw, v: "debian:bookworm-slim")
    (check,) = cuda_checks([(FW, variant)], fake_inventory("13.0"))
    assert check.status == "warn" and "names no CUDA version" in check.found


def test_gpu_cells_on_a_gpu_host_and_more_gpus_than_it_has(tmp_path, monkeypatch):
    variant = gpu_variant(13)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("matrun.runner.doctor.report.gpu_inventory", lambda: fake_inventory("13.0"))
    write(tmp_path, fixed=f'device = "gpu"\nvariant = "{variant}"\ngpus = 2')
    _, doc = as_json("--executor", "local", env={"MATRUN_HOME": str(tmp_path / "home")})
    checks = by_name(doc)
    assert checks["gpus"] == {"name": "gpus", "status": "ok", "found": "2 GPU cell(s); 2 GPU(s): 2 × NVIDIA H200; "
                              "driver 550.54.15 (CUDA up to 13.0)", "fix": None}
    assert checks[f"cuda {FW}:{variant}"]["status"] == "ok"
    monkeypatch.setattr("matrun.runner.doctor.report.gpu_inventory", lambda: fake_inventory("12.4", n=1))
    code, doc = as_json("--executor", "local", env={"MATRUN_HOME": str(tmp_path / "home")})
    checks = by_name(doc)
    assert code == 1 and checks["gpus"]["status"] == "fail" and "asks for GPU(s) 1" in checks["gpus"]["found"]
    assert checks[f"cuda {FW}:{variant}"]["status"] == "fail"
    cells = plan_cells(load_matrix(tmp_path / "matrix.toml"), lambda fw, v: "env")
    assert gpus_check(cells, {"available": False, "reason": "no driver", "gpus": []}).found == (
        "2 cell(s) ask for a GPU; no GPU seen (NVML: no driver)")


def test_the_nvidia_container_runtime_is_found_by_runtime_hook_or_cdi(tmp_path):
    none = gpu_runtime_check({"Runtimes": {"runc": {}}, "CDISpecDirs": [str(tmp_path)]}, which=lambda name: None)
    assert none.status == "fail" and "runtimes runc" in none.found and "nvidia-ctk runtime configure" in none.fix
    assert gpu_runtime_check({"Runtimes": {"nvidia": {}}, "CDISpecDirs": [str(tmp_path)]},
                             which=lambda name: None).status == "ok"
    hook = gpu_runtime_check({"CDISpecDirs": [str(tmp_path)]}, which=lambda name: f"/usr/bin/{name}")
    assert hook.status == "ok" and "nvidia-container-runtime-hook at /usr/bin/" in hook.found
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    cdi = gpu_runtime_check({"CDISpecDirs": [str(tmp_path)]}, which=lambda name: None)
    assert cdi.status == "ok" and f"CDI spec {tmp_path / 'nvidia.yaml'}" in cdi.found


# --- the Docker engine up and down ----------------------------------------------------------------

def test_engine_up_with_the_image_built(tmp_path, monkeypatch, docker_client, torch_image):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "docker")
    checks = by_name(doc)
    assert checks["engine"]["status"] == "ok" and checks["engine"]["found"].startswith(
        f"Docker {docker_client.version()['Version']} answers at ")
    image = checks[f"image {FW}:cpu"]
    if torch_image.framework == FW:  # the newest image of the current recipe (the executor's own pick)
        assert image["status"] == "ok" and image["found"].startswith(f"{image_repository(FW)}:cpu-")
    assert checks["cgroup"]["status"] in ("ok", "warn") and checks["cgroup"]["found"].startswith("cgroup v")
    assert "gpu-runtime" not in checks  # no GPU cell
    assert code == (1 if doc["failures"] else 0) and doc["failures"] == 0


def test_an_image_not_built_from_the_current_recipe_fails_with_the_build_command(tmp_path, monkeypatch,
                                                                                   docker_client):
    variant = gpu_variant()  # its image cannot be built here (no registry for the CUDA base)
    try:
        DockerExecutor(docker_client).image(FW, variant)
        pytest.skip(f"an image of {FW}:{variant} is built here")
    except EnvironmentBuildError:
        pass
    monkeypatch.chdir(tmp_path)
    write(tmp_path, fixed=f'variant = "{variant}"')  # CPU cells of the GPU build: no GPU needed
    result = run("--executor", "docker")
    assert result.exit_code == 1
    assert f"FAIL  image {FW}:{variant}" in result.stdout
    assert f"recipe {recipe_hash(FW, variant)[:12]}" in result.stdout
    assert f"fix: matrun build matrix.toml --where framework={FW} --where variant={variant}" in result.stdout
    assert result.stderr == f"Error: 1 check(s) failed: image {FW}:{variant}\n"


def test_gpu_cells_under_docker_need_the_nvidia_runtime(tmp_path, monkeypatch, docker_client):
    info = docker_client.info()
    if any("nvidia" in r for r in info.get("Runtimes") or {}):
        pytest.skip("this engine has an NVIDIA runtime")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("matrun.runner.doctor.report.gpu_inventory", lambda: fake_inventory("13.0"))
    write(tmp_path, fixed=f'device = "gpu"\nvariant = "{gpu_variant()}"')
    _, doc = as_json("--executor", "docker")
    runtime = by_name(doc)["gpu-runtime"]
    assert runtime["status"] == "fail" and "need the NVIDIA container runtime" in runtime["found"]


def test_engine_down(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "docker", env={"DOCKER_HOST": NO_ENGINE})
    checks = by_name(doc)
    assert code == 1 and doc["executor"] == "docker"
    assert checks["engine"]["status"] == "fail" and "/nonexistent/matrun-test/docker.sock does not exist" in \
        checks["engine"]["found"]
    assert "matrun engine start" in checks["engine"]["fix"]
    assert not any(name.startswith("image ") for name in checks)  # nothing more asked of no engine
    # auto without an engine: the local executor, which needs none
    code, doc = as_json(env={"DOCKER_HOST": NO_ENGINE, "MATRUN_HOME": str(tmp_path / "home")})
    assert code == 0 and doc["executor"] == "local"
    assert by_name(doc)["executor"]["found"] == f"executor: local (auto: no Docker engine answers at {NO_ENGINE})"


def test_an_engine_address_that_is_not_local_is_never_contacted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "docker", env={"DOCKER_HOST": "tcp://192.0.2.7:2375"})
    engine = by_name(doc)["engine"]
    assert code == 1 and engine["status"] == "fail" and "is not local" in engine["found"]


# --- Slurm up and down ----------------------------------------------------------------------------

def test_slurm_down_and_slurm_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "slurm", env={"SLURM_CONF": "/nonexistent/slurm.conf"})
    checks = by_name(doc)
    assert code == 1 and "gpus" not in checks and "engine" not in checks  # the nodes', not this host's
    if checks["slurm-client"]["status"] != "ok":
        slurm_missing(f"Slurm's client is not installed: {checks['slurm-client']['found']}")
    assert checks["slurm-controller"] == {
        "name": "slurm-controller", "status": "fail",
        "found": "no Slurm controller answers (SLURM_CONF names /nonexistent/slurm.conf, which is not a file; "
                 "SLURM_CONF: /nonexistent/slurm.conf)",
        "fix": "point SLURM_CONF at the cluster's slurm.conf, or start the local test cluster (`matrun slurm "
               "start`, then the `export SLURM_CONF=…` it prints)"}
    # the configuration of a test cluster whose daemons do not run: a controller that is down
    conf, _ = cluster_config_text(tmp_path, ctld_port=free_port(), slurmd_port=free_port(), cpus=1, memory_mb=512)
    (tmp_path / "slurm.conf").write_text(conf)
    code, doc = as_json("--executor", "slurm", env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    controller = by_name(doc)["slurm-controller"]
    assert code == 1 and controller["status"] == "fail"
    assert controller["found"].startswith("no Slurm controller answers (scontrol ping: Slurmctld(primary) at ")
    assert " is DOWN; SLURM_CONF: " in controller["found"]
    empty = tmp_path / "bin"
    empty.mkdir()
    code, doc = as_json("--executor", "slurm", env={"PATH": str(empty)})
    client = by_name(doc)["slurm-client"]
    assert code == 1 and client == {
        "name": "slurm-client", "status": "fail", "found": "sbatch, squeue, scancel, scontrol not on PATH",
        "fix": "install Slurm's client (Debian: apt-get install slurm-client) and run matrun on a host that can "
               "submit to the cluster"}
    assert "slurm-controller" not in by_name(doc)


# --- disks and the machine ------------------------------------------------------------------------

def test_free_disk_space_thresholds(tmp_path):
    ok = disk_check("results", tmp_path / "not" / "yet")
    assert ok.name == "disk results" and f"file system of {tmp_path})" in ok.found
    huge = 1 << 62
    warn = disk_check("results", tmp_path, warn_bytes=huge)
    fail = disk_check("results", tmp_path, warn_bytes=huge, fail_bytes=huge)
    assert (warn.status, fail.status) == ("warn", "fail")
    assert fail.fix == f"free space there (`df -h {tmp_path}`), or point [sweep] results at a larger disk"
    assert DISK_FAIL_BYTES == 1 << 30


def test_noise_warnings_are_warnings_and_do_not_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, fixed='cpuset = "0"')
    seen = []
    sentence = "CPU frequency governor 'powersave' on 1 of the cells' CPUs: set 'performance'"
    monkeypatch.setattr(doctor_checks, "noise_warnings", lambda cpus: seen.append(cpus) or [sentence])
    report = doctor(matrix_path=tmp_path / "matrix.toml", executor="local")
    assert seen == [{0}] and report.ok
    machine = [(c.name, c.status, c.found) for c in report.checks if c.name == "machine"]
    assert machine == [("machine", "warn", sentence)]
    monkeypatch.setattr(doctor_checks, "noise_warnings", lambda cpus: [])
    report = doctor(matrix_path=tmp_path / "matrix.toml", executor="local")
    assert [c.status for c in report.checks if c.name == "machine"] == ["ok"]


# --- the command line: exit codes, JSON, bad input -------------------------------------------------

def test_the_console_script_prints_only_json_on_stdout(tmp_path):
    write(tmp_path)
    env = {**os.environ, "DOCKER_HOST": NO_ENGINE, "MATRUN_HOME": str(tmp_path / "home")}
    proc = subprocess.run([MATRUN, "doctor", "--executor", "docker", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout)  # the whole of stdout is one document
    assert proc.returncode == 1 and doc["ok"] is False
    assert proc.stderr.startswith("Error: ") and "engine" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([MATRUN, "doctor", "--executor", "local"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "matrix.toml: 2 cell(s), executor local: can run here (0 failed" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--executor", "bogus"], "Error: unknown executor 'bogus'; available: auto, local, docker, slurm"),
    (["--executor", "docker;rm -rf /"], "Error: unknown executor 'docker;rm -rf /'"),
    (["--executor", ""], "Error: unknown executor ''"),
    (["--where", "threads"], "Error: --where 'threads': expected KEY=VALUE"),
    (["--where", "$(id)=1"], "Error: --where '$(id)=1': unknown parameter '$(id)'"),
    (["--where", "threads=7"], "Error: --where matches no cell of the matrix"),
    (["--profile", "../../etc"], "Error: matrix.toml: [profiles -> ../../etc] no such profile"),
    (["--where", "cell=zz"], "Error: --where matches no cell of the matrix"),
])
def test_hostile_flags_are_an_error_line_and_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stdout == ""


@pytest.mark.parametrize("text, message", [
    ("[sweep\nname = 1", "matrix.toml"),
    ('[sweep]\nname = "x"\n[fixed]\nthreads = "many"\n', "[fixed -> threads]"),
    ('[sweep]\nname = "x"\nexecutor = "ssh"\n', "[sweep -> executor]"),
    ('[sweep]\nname = "x"\n[fixed]\ndevice = "gpu\\u0000"\n', "[fixed -> device]"),
])
def test_a_malformed_matrix_is_the_loader_s_error(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.toml").write_text(text, encoding="utf-8")
    result = run("--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("Error: ") and message in result.stderr and "Traceback" not in result.stderr


def test_a_missing_matrix_file_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("no-such.toml")
    assert result.exit_code == 2 and result.stderr.startswith("Error: ") and "no-such.toml" in result.stderr
