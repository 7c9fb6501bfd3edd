"""`matrun sweep --executor slurm` on a real one-node Slurm cluster (Debian's Slurm 22.05, started
by the session's ``slurm_cluster`` fixture), each task running its cell with the docker executor
on the real Docker engine: a sweep ingested end to end, failures with their exit codes, a task
killed at its time limit recorded as timeout, cancel and Ctrl-C leaving no job and no container,
--detach picked up by a later sweep or ingest; and the pure parts: sbatch arguments argument by
argument, hostile values refused, squeue / jobcomp parsing.

The Slurm time-limit test needs Slurm's own clock (limits are whole minutes, checked every 30 s):
its sweep is submitted early (``timeout_sweep``, at the end of the job-array test) and runs beside
the short tests that follow on the second CPU; the time-limit test collects it after them, while
the task is most likely still running (a sweep that finds it ended submits it again as a second
attempt, another minute); the longer tests come after it, with both CPUs free again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_sweep import sql

from matrun.errors import MatrixError
from matrun.runner.slurm.executor import (
    BATCH_SCRIPT, array_arguments, cpus_per_task, sbatch_resources, task_params,
)
from matrun.runner.planning.matrix import load_matrix, parse_matrix
from matrun.runner.slurm.settings import SlurmSettings, time_limit_minutes
from matrun.runner.slurm.state import decode_exit, expand_indices, parse_jobcomp, parse_squeue_json

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
TINY = {"dataset": "synthetic", "synthetic_train": 256, "synthetic_test": 128, "batch_size": 32, "epochs": 1,
        "warmup_steps": 2, "threads": 1, "cpuset": "0", "onednn_check": False}
LONG = {"synthetic_train": 200000, "synthetic_shape": [3, 64, 64], "epochs": 50}


def matrun(*args: str, cwd: Path, cluster, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **cluster.env})
    if check and proc.returncode != 0:
        raise AssertionError(f"matrun {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_matrix(directory: Path, body: str = "", *, slurm: str = "", fixed: dict | None = None) -> str:
    """A slurm matrix in ``directory`` (tiny synthetic cells, ``fixed`` over them); returns its
    (unique) sweep name."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"s{uuid.uuid4().hex[:10]}"
    values = {**TINY, **(fixed or {})}
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
    (directory / "matrix.toml").write_text(
        f'[sweep]\nname = "{name}"\nexecutor = "slurm"\ntimeout = 600\n'
        f'[slurm]\npoll_interval = 1\ngrace = 1\n{slurm}\n[fixed]\n{lines}\n{body}')
    return name


def squeue_tasks(cluster) -> list[dict]:
    out = subprocess.run(["squeue", "--json", "-t", "all"], env={**os.environ, **cluster.env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["jobs"]


def active_jobs(cluster, name: str) -> list[dict]:
    return [j for j in squeue_tasks(cluster) if j["name"] == f"matrun-{name}"
            and j["job_state"] in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")]


def containers_of(client, sweep: str) -> list:
    return client.containers.list(all=True, filters={"label": f"matrun.sweep={sweep}"})


@contextlib.contextmanager
def cancelled_at_the_end(directory: Path, cluster):
    """Whatever the test's fate, no job of its sweep outlives it (a job left running would load
    the machine for the rest of the run): `matrun cancel` there, which says "nothing to
    cancel" when the test cancelled them itself."""
    try:
        yield
    finally:
        matrun("cancel", cwd=directory, cluster=cluster, check=False)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


# --- pure: sbatch arguments, validation, Slurm's records ----------------------------------------

def _cells(tmp_path: Path, text: str):
    path = tmp_path / "m.toml"
    path.write_text(text)
    return load_matrix(path)


def test_sbatch_arguments_are_exact(tmp_path):
    m = _cells(tmp_path, '[sweep]\nname = "x"\ntimeout = 100\n[fixed]\nthreads = 1\n'
                         '[[include]]\ncpuset = "0-1"\nmemory_limit = "1g"\n'
                         '[[include]]\nthreads = 4\n'
                         '[[include]]\nthreads = "unset"\n'
                         '[[include]]\ndevice = "gpu"\nvariant = "cuda"\ngpus = 2\ntimeout = 3000\n')
    cpu, four, unset, gpu = (dict(c.values) for c in m.cells[-4:])  # after the [fixed]-only cell
    default = SlurmSettings()
    assert sbatch_resources(cpu, default, job_name="matrun-x") == [
        "--job-name=matrun-x", "--cpus-per-task=2", "--mem=1536M", "--time=7", "--exclusive", "--no-requeue"]
    assert [cpus_per_task(four), cpus_per_task(unset)] == [4, 1]
    assert [cpus_per_task({**four, "workers": 2}), cpus_per_task({**unset, "workers": 3})] == [4, 3]
    site = SlurmSettings(partition="gpu,debug", account="proj-1", qos="high", exclusive=False, time_margin=0,
                         max_time=30, sbatch_args=("--constraint=a100&nvlink", "--contiguous"))
    assert sbatch_resources(gpu, site, job_name="matrun-x") == [
        "--job-name=matrun-x", "--cpus-per-task=1", "--time=30", "--gres=gpu:2", "--partition=gpu,debug",
        "--account=proj-1", "--qos=high", "--no-requeue", "--constraint=a100&nvlink", "--contiguous"]
    assert time_limit_minutes(3000, SlurmSettings(time_margin=0)) == 50
    assert time_limit_minutes(1, SlurmSettings(time_margin=0)) == 1
    assert array_arguments(3, 0, Path("/r/s/.slurm/1")) == [
        "--parsable", "--array=0-2", "--chdir=/r/s/.slurm/1", "--output=task-%a.log"]
    assert array_arguments(5, 2, Path("/w"))[1] == "--array=0-4%2"
    # The batch script is constant: the interpreter and tasks.json reach it as arguments.
    assert '"$1"' in BATCH_SCRIPT and '"$2"' in BATCH_SCRIPT and "{" not in BATCH_SCRIPT
    # A task hands its gpu cell the GPUs Slurm allocated, the first `gpus` of them.
    assert task_params(gpu, {"SLURM_JOB_GPUS": "1,3,4"})["gpu_ids"] == [1, 3]
    assert "gpu_ids" not in task_params(cpu, {"SLURM_JOB_GPUS": "0,1"})
    assert "gpu_ids" not in task_params(gpu, {"SLURM_JOB_GPUS": "0;rm"})
    # A multi-node cell: one task per node, each with its node's CPUs; srun starts them.
    assert sbatch_resources({**four, "workers": 2, "nodes": 2}, default, job_name="matrun-x") == [
        "--job-name=matrun-x", "--cpus-per-task=4", "--nodes=2", "--ntasks-per-node=1", "--time=7",
        "--exclusive", "--no-requeue"]
    assert 'exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$1"' in BATCH_SCRIPT


@pytest.mark.parametrize("section, message", [
    ('partition = "debug;rm -rf /"', '[slurm -> partition] expected a partition name'),
    ('partition = "a b"', '[slurm -> partition] expected a partition name'),
    ('partition = "-p"', '[slurm -> partition] expected a partition name'),
    ('partition = "$(id)"', '[slurm -> partition] expected a partition name'),
    ('partition = "debug\\n#SBATCH --uid=0"', '[slurm -> partition] expected a partition name'),
    ('account = "--wrap=id"', '[slurm -> account] expected an account name'),
    ('qos = ""', '[slurm -> qos] expected a QOS name'),
    ('sbatch_args = ["--wrap=id"]', "sbatch flag --wrap is not allowed here"),
    ('sbatch_args = ["--output=/etc/passwd"]', "sbatch flag --output is not allowed here"),
    ('sbatch_args = ["-p debug"]', "expected the long form --name=value"),
    ('sbatch_args = ["--constraint=a\\nb"]', "--constraint needs a value of 1 to 256 printable characters"),
    ('sbatch_args = "--constraint=x"', "expected a list of strings"),
    ('python = "venv/bin/python"', "[slurm -> python] expected the absolute path"),
    ('throttle = -1', "[slurm -> throttle] expected a whole number"),
    ('exclusive = "yes"', "[slurm -> exclusive] expected true or false"),
    ('nodes = 2', "[slurm -> nodes] unknown key"),
    ('runtime = "sh -c id"', "[slurm -> runtime] expected one of 'docker', 'local'"),
    ('runtime = ["local"]', "[slurm -> runtime] expected one of 'docker', 'local'"),
])
def test_hostile_or_wrong_slurm_settings_are_refused(section, message):
    with pytest.raises(MatrixError) as err:
        parse_matrix({"slurm": __import__("tomllib").loads(section), "sweep": {"name": "x"}}, path=Path("/m/matrix.toml"))
    assert message in str(err.value)
    assert str(err.value).startswith("matrix.toml: [slurm -> ")


def test_the_slurm_example_of_the_matrix_docs_parses_as_described():
    import re
    import tomllib

    doc = (Path(__file__).resolve().parents[1] / "docs" / "MATRIX.md").read_text(encoding="utf-8")
    example = re.search(r"## `\[slurm\]`.*?```toml\n(.*?)```", doc, flags=re.S).group(1)
    m = parse_matrix({"sweep": {"name": "x"}, **tomllib.loads(example)}, path=Path("/m/matrix.toml"))
    assert m.slurm == SlurmSettings(partition="gpu,debug", account="proj-42", qos="normal", exclusive=True,
                                    throttle=4, time_margin=300.0, max_time=240,
                                    sbatch_args=("--constraint=avx512", "--reservation=bench"),
                                    python="/shared/venvs/matrun/bin/python", poll_interval=10.0, grace=30.0,
                                    runtime="docker")


def test_hostile_flags_are_refused_before_anything_is_submitted(tmp_path):
    write_matrix(tmp_path)
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}
    for args, message in ((["--partition", "debug;id"], "--partition: expected a partition name"),
                          (["--sbatch-arg", "--uid=0"], "--sbatch-arg: sbatch flag --uid is not allowed"),
                          (["--executor", "docker", "--detach"], "--detach: only for --executor slurm")):
        proc = subprocess.run([*MATRUN, "sweep", *args], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("spec.json"))


def test_multi_node_cells_need_the_local_runtime():
    from matrun.runner.slurm.executor import SlurmExecutor

    assert SlurmExecutor().refusal({"nodes": 2}) == (
        'nodes = 2: with runtime "docker" each task runs its cell in a container without network '
        "(--network none), so the workers on different nodes cannot reach each other; set runtime = "
        '"local" in [slurm] (matrun\'s environments, the hosts\' network)')
    assert SlurmExecutor().refusal({"nodes": 1}) is None
    local = SlurmExecutor(SlurmSettings(runtime="local"))
    assert local.refusal({"nodes": 2}) is None
    assert local.enforces == frozenset({"cpuset"}) and SlurmExecutor().enforces == {"memory_limit", "cpuset"}


@pytest.mark.parametrize("job_id", [None, "", "abc", "12;reboot", "$(id)", "-1", " 12 x"])
def test_the_epilog_does_nothing_and_exits_0_without_a_job_id(job_id, capsys):
    from matrun.runner.slurm import epilog as slurm_epilog

    environ = {} if job_id is None else {"SLURM_JOB_ID": job_id}
    assert slurm_epilog.main(environ={**environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}) == 0
    assert "SLURM_JOB_ID is not set to a job id; nothing to do" in capsys.readouterr().err


def test_the_epilog_exits_0_when_no_engine_answers(capsys, monkeypatch):
    # A failing epilog drains the node: no engine (a local-runtime node) is nothing to remove.
    from matrun.runner.slurm import epilog as slurm_epilog

    monkeypatch.setattr(slurm_epilog, "SYSTEM_SOCKET", "unix:///nonexistent/system.sock")
    assert slurm_epilog.main(environ={"SLURM_JOB_ID": "17", "SLURM_JOB_UID": "0",
                                      "DOCKER_HOST": "unix:///nonexistent/docker.sock"}) == 0
    monkeypatch.setattr(slurm_epilog, "remove_job_containers", lambda *a, **k: 1 / 0)
    assert slurm_epilog.main(environ={"SLURM_JOB_ID": "17"}) == 0
    assert "matrun-slurm-epilog: job 17: division by zero" in capsys.readouterr().err


def test_the_epilog_asks_these_engines():
    from matrun.runner.slurm.epilog import engine_urls

    assert engine_urls({}) == ["unix:///var/run/docker.sock"]
    assert engine_urls({"DOCKER_HOST": "unix:///run/d.sock", "SLURM_JOB_UID": "1000"}) == [
        "unix:///run/d.sock", "unix:///var/run/docker.sock", "unix:///run/user/1000/docker.sock"]
    assert engine_urls({"DOCKER_HOST": "unix:///var/run/docker.sock", "SLURM_JOB_UID": "../../x"}) == [
        "unix:///var/run/docker.sock"]


def test_the_test_cluster_runs_matrun_s_epilog(tmp_path):
    from matrun.runner.slurm.cluster import EPILOG, cluster_config_text, epilog_script

    conf, _ = cluster_config_text(tmp_path, ctld_port=1, slurmd_port=2, cpus=2, memory_mb=1024)
    assert f"Epilog={tmp_path / EPILOG}" in conf.splitlines()
    assert epilog_script("/opt/my venv/bin/python") == (
        "#!/bin/sh\n# Written by matrun (runner/slurm/cluster.py): remove the containers of a matrun task Slurm killed.\n"
        "exec '/opt/my venv/bin/python' -m matrun.runner.slurm.epilog\n")


def test_squeue_and_jobcomp_records_are_read():
    # squeue --json of Slurm 22.05 (wait status) and 23+ (objects, state lists); a pending array rest.
    text = json.dumps({"jobs": [
        {"job_id": 8, "array_job_id": 7, "array_task_id": 0, "name": "matrun-a", "job_state": "TIMEOUT",
         "exit_code": 0, "start_time": 10, "end_time": 70, "nodes": "n1", "time_limit": 1},
        {"job_id": 9, "array_job_id": 7, "array_task_id": 1, "name": "matrun-a", "job_state": "FAILED",
         "exit_code": 127 << 8, "start_time": 11, "end_time": 12, "nodes": "n1"},
        {"job_id": 7, "array_job_id": 7, "array_task_id": None, "array_task_string": "2-3%1",
         "name": "matrun-a", "job_state": "PENDING", "exit_code": 0, "start_time": 0, "end_time": 0},
        {"job_id": 12, "array_job_id": {"set": True, "number": 11}, "array_task_id": {"set": True, "number": 0},
         "name": "matrun-a", "job_state": ["CANCELLED", "COMPLETING"],
         "exit_code": {"status": "SIGNALED", "return_code": 0, "signal": {"id": 15, "name": "TERM"}}},
        {"job_id": 13, "array_job_id": 7, "array_task_id": 5, "name": "someone-else", "job_state": "RUNNING"},
    ]})
    states = parse_squeue_json(text, job_ids=["7", "11"], job_name="matrun-a")
    assert sorted(states) == [("11", 0), ("7", 0), ("7", 1), ("7", 2), ("7", 3)]
    assert (states[("7", 0)].state, states[("7", 0)].time_limit) == ("TIMEOUT", 1)
    assert (states[("7", 1)].exit_code, states[("7", 1)].signal) == (127, None)
    assert states[("7", 3)].queued and states[("7", 3)].active
    assert states[("11", 0)].state == "COMPLETING" and states[("11", 0)].signal == 15
    assert decode_exit(9) == (None, 9) and decode_exit(256) == (1, None)
    assert expand_indices("1,3,5-9:2%4") == [1, 3, 5, 7, 9]
    log = ("JobId=8 UserId=root(0) GroupId=root(0) Name=matrun-a JobState=OUT_OF_MEMORY Partition=p "
           "TimeLimit=5 StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:01:00 NodeList=n1 NodeCnt=1 "
           "ArrayJobId=7 ArrayTaskId=0 DerivedExitCode=0:0 ExitCode=0:9\n"
           "JobId=20 Name=matrun-a JobState=COMPLETED ArrayJobId=0 ArrayTaskId=4294967294 ExitCode=0:0\n")
    comp = parse_jobcomp(log, job_ids=["7"])
    assert list(comp) == [("7", 0)]
    assert (comp[("7", 0)].state, comp[("7", 0)].signal, comp[("7", 0)].end - comp[("7", 0)].start) == \
        ("OUT_OF_MEMORY", 9, 60.0)


def test_runs_slurm_ended_are_recorded_from_its_state_and_ingested(tmp_path):
    # Slurm no longer lists the tasks in squeue (MinJobAge passed): their ends come from the
    # jobcomp log; every task that started gets a result.json and lands in the warehouse.
    from matrun.runner.slurm.jobs import SweepJobs
    from matrun.warehouse.ingest import ingest

    sweep_dir = tmp_path / "results" / "sw"
    tasks = []
    for index in range(6):
        run_dir = sweep_dir / f"{index:016x}" / "0-1"
        run_dir.mkdir(parents=True)
        (run_dir / "spec.json").write_text(json.dumps({
            "schema_version": 1, "sweep": "sw", "cell_id": f"{index:016x}", "repeat": 0, "attempt": 1,
            "env_id": "torch-cpu-abc", "data_dir": "/d", "params": {"framework": "torch"}}))
        if index != 3:  # task 3 never started
            (run_dir / "slurm.json").write_text(json.dumps({"started_at": "2026-01-01T00:00:10+00:00",
                                                            "host": {"hostname": "n1"}}))
        tasks.append({"index": index, "run_dir": str(run_dir), "cell_id": f"{index:016x}", "repeat": 0, "attempt": 1})
    (Path(tasks[2]["run_dir"]) / "nodes" / "node-1").mkdir(parents=True)  # a multi-node cell's second node
    (Path(tasks[2]["run_dir"]) / "nodes" / "node-1" / "stderr.log").write_text("gloo: Connection reset by peer\n")
    sub = sweep_dir / ".slurm" / "20260101T000000-1-0"
    sub.mkdir(parents=True)
    (sub / "tasks.json").write_text(json.dumps({"job_name": "matrun-sw", "tasks": tasks}))
    (sub / "job.json").write_text(json.dumps({"job_id": "7", "cluster": "c", "submitted_at": 0, "grace": 5,
                                              "uid": os.getuid(), "finalized": False}))
    (sub / "task-0.log").write_text("slurmstepd: error: *** JOB 8 ON n1 CANCELLED AT 2026-01-01T00:01:10 "
                                    "DUE TO TIME LIMIT ***\n")
    line = ("JobId={j} Name=matrun-sw JobState={s} TimeLimit=1 StartTime=2026-01-01T00:00:10 "
            "EndTime=2026-01-01T00:01:10 NodeList=n1 ArrayJobId=7 ArrayTaskId={i} ExitCode={e}\n")
    log = "".join(line.format(j=8 + i, s=s_, i=i, e=e) for i, s_, e in (
        (0, "TIMEOUT", "0:15"), (1, "OUT_OF_MEMORY", "0:9"), (2, "NODE_FAIL", "0:0"), (3, "CANCELLED", "0:0")))
    t0 = time.time()  # task 5 ended just now (Slurm writes local time without a zone)
    log += line.replace("EndTime=2026-01-01T00:01:10", "EndTime=" + time.strftime("%Y-%m-%dT%H:%M:%S",
                        time.localtime(t0))).format(j=13, s="COMPLETED", i=5, e="0:0")

    def query(ids, *, job_name, config, tasks):
        assert (ids, job_name) == (["7"], "matrun-sw") and len(tasks) == 6
        return parse_jobcomp(log, job_ids=ids, job_name=job_name)  # task 4: in no record at all

    jobs = SweepJobs(sweep_dir, query=query, config={"ClusterName": "c"})
    views = {v.entry.index: v for v in jobs.refresh(now=t0)}
    assert {i: v.phase for i, v in views.items()} == {0: "finished", 1: "finished", 2: "finished", 3: "dropped",
                                                      4: "ending", 5: "ending"}
    assert {i: views[i].status for i in (0, 1, 2)} == {0: "timeout", 1: "oom", 2: "failed"}
    assert "[node-1] gloo: Connection reset by peer" in json.loads(
        (Path(tasks[2]["run_dir"]) / "result.json").read_text())["error_tail"]
    assert not (sweep_dir / f"{3:016x}").exists()  # nothing ran: nothing is left
    result = json.loads((Path(tasks[0]["run_dir"]) / "result.json").read_text())
    assert (result["executor"], result["exit_code"], result["host"], result["wall_seconds"]) == \
        ("slurm", None, {"hostname": "n1"}, 60.0)
    assert "DUE TO TIME LIMIT" in result["error_tail"]
    assert result["error_tail"].endswith("Slurm ended job 7_0 on n1: JobState=TIMEOUT (time limit 1 min), "
                                         "killed by signal 15 [jobcomp]")
    # After the grace: a COMPLETED task without its result, and one Slurm forgot, are failed runs.
    views = {v.entry.index: v for v in jobs.refresh(now=t0 + 7)}
    assert (views[4].status, views[5].status) == ("failed", "failed")
    assert "Slurm no longer knows job 7_4" in json.loads((Path(tasks[4]["run_dir"]) / "result.json").read_text())[
        "error_tail"]
    assert json.loads((sub / "job.json").read_text())["finalized"] is True
    report = ingest([sweep_dir], warehouse=tmp_path / "w.duckdb")
    assert (len(report.ingested), report.skipped, report.incomplete) == (5, [], [])
    assert sorted(r[0] for r in sql(tmp_path / "w.duckdb", "SELECT status FROM runs")) == \
        ["failed", "failed", "failed", "oom", "timeout"]


# --- a real cluster ------------------------------------------------------------------------------

def test_the_cluster_runs_from_its_recorded_pids(slurm_cluster, tmp_path):
    proc = matrun("slurm", "status", "--state-dir", str(slurm_cluster.state_dir), cwd=tmp_path, cluster=slurm_cluster)
    for daemon, pid in slurm_cluster.pids.items():
        assert f"{daemon} {pid}" in proc.stdout
    assert "idle" in proc.stdout and "node0" in proc.stdout and "multi" in proc.stdout


@pytest.mark.slow
def test_one_and_two_worker_ddp_cells_through_slurm_and_their_speedup(tmp_path, slurm_cluster, docker_client,
                                                                      torch_image):
    # Weak scaling on the node's two CPUs: one process with 2 threads against two gloo DDP
    # workers of 1 thread each (one CPU each), 32 samples per worker per step.  Runs before the
    # time-limit test's job takes CPU 1.
    name = write_matrix(tmp_path, "[axes]\nworkers = [1, 2]\n",
                        fixed={"threads": 2, "cpuset": "0-1", "synthetic_train": 1024, "scaling": "weak"})
    proc = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster)
    assert "--cpus-per-task=2" in proc.stderr and "2 runs (2 ok)" in proc.stdout
    db = tmp_path / "matrun.duckdb"
    by_workers = dict(sql(db, "SELECT CAST(params ->> 'workers' AS INTEGER), throughput FROM runs"))
    assert sorted(by_workers) == [1, 2] and all(t > 0 for t in by_workers.values())
    summary = json.loads(sql(db, "SELECT summary FROM runs WHERE params ->> 'workers' = '2'")[0][0])
    assert summary["workers"] == 2 and summary["global_batch"] == 64 and summary["replicas_identical"] is True
    assert summary["exchange"]["backend"] == "gloo" and summary["exchange"]["seconds_median"] > 0
    rows = sql(db, "SELECT workers, global_batch, per_worker_batch, scaling, speedup, efficiency, "
                   "exchange_s_median FROM worker_scaling ORDER BY workers")
    assert [r[:4] for r in rows] == [(1, 32, 32.0, "weak"), (2, 64, 32.0, "weak")]
    assert rows[0][4] == 1.0 and rows[1][4] == pytest.approx(by_workers[2] / by_workers[1])
    assert rows[1][5] == pytest.approx(rows[1][4] / 2) and rows[1][6] == summary["exchange"]["seconds_median"]
    assert containers_of(docker_client, name) == []


@pytest.mark.slow
def test_a_two_node_ddp_cell_runs_on_two_slurm_nodes(tmp_path, slurm_cluster, torch_env):
    # Partition "multi": nodes n1 and n2, each its own slurmd on this host, 1 CPU each.  The
    # cell's task gets both; srun starts it on each; the nodes meet through the run directory
    # (rendezvous/) and their DDP workers (one per node) through node n1's address.
    name = write_matrix(tmp_path, "[axes]\nnodes = [1, 2]\n", fixed={"cpuset": "", "synthetic_train": 1024},
                        slurm='partition = "multi"\nruntime = "local"')
    proc = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster)
    assert "with the local executor on their node" in proc.stderr
    assert "--nodes=2 --ntasks-per-node=1" in proc.stderr and "2 runs (2 ok)" in proc.stdout
    db = tmp_path / "matrun.duckdb"
    summary = json.loads(sql(db, "SELECT summary FROM runs WHERE params ->> 'nodes' = '2'")[0][0])
    assert summary["workers"] == 2 and summary["replicas_identical"] is True
    assert summary["exchange"]["backend"] == "gloo" and summary["exchange"]["seconds_median"] > 0
    (run,) = [p.parent for p in (tmp_path / "results" / name).glob("*/*/rendezvous")]
    peers = [json.loads((run / "rendezvous" / f"node-{k}.json").read_text()) for k in (0, 1)]
    assert [(p["node_rank"], p["addr"], p["iface"]) for p in peers] == [(0, "127.0.0.1", "lo"), (1, "127.0.0.1", "lo")]
    head, other = json.loads((run / "slurm.json").read_text()), json.loads((run / "nodes" / "node-1" / "slurm.json").read_text())
    assert {head["node"], other["node"]} == {"n1", "n2"} and (head["node_rank"], other["node_rank"]) == (0, 1)
    assert head["job_id"] == other["job_id"] and head["runtime"] == "local"
    node1 = json.loads((run / "nodes" / "node-1" / "node.json").read_text())
    assert node1["status"] == "ok" and node1["exit_code"] == 0
    plan1 = json.loads((run / "workers-node-1.json").read_text())
    assert [(p["rank"], p["env"]["MASTER_ADDR"], p["env"]["MASTER_PORT"]) for p in plan1["processes"]] == [
        (1, "127.0.0.1", str(peers[0]["ports"][0]))]
    report = json.loads((run / "workers" / "worker-1" / "worker.json").read_text())
    assert (report["rank"], report["node_rank"]) == (1, 1)
    rows = sql(db, "SELECT nodes, workers, scaling, ref_cell_id IS NOT NULL, speedup > 0 FROM worker_scaling "
                   "ORDER BY workers")
    assert rows == [(1, 1, "weak", True, True), (2, 2, "weak", True, True)]


@pytest.mark.slow
def test_tensorflow_and_mxnet_cells_across_two_slurm_nodes(tmp_path, slurm_cluster, tf_env, mxnet_env):
    # TensorFlow's TF_CONFIG lists both nodes' workers; MXNet's scheduler and server run on node 0.
    write_matrix(tmp_path, '[[zip]]\nframework = ["tensorflow", "mxnet", "mxnet"]\n'
                           'kvstore = ["device", "dist_sync", "dist_async"]\nlayout = ["nhwc", "nchw", "nchw"]\n',
                 fixed={"cpuset": "", "synthetic_train": 1024, "nodes": 2},
                 slurm='partition = "multi"\nruntime = "local"')
    proc = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster)
    assert "3 runs (3 ok)" in proc.stdout
    rows = sql(tmp_path / "matrun.duckdb", "SELECT params ->> 'framework', params ->> 'kvstore', summary FROM runs "
                                           "ORDER BY 1, 2")
    seen = []
    for framework, kvstore, text in rows:
        s = json.loads(text)
        assert s["workers"] == 2 and [w["node_rank"] for w in s["per_worker"]] == [0, 1], (framework, s)
        assert s["exchange"]["seconds_median"] > 0
        seen.append((framework, kvstore, s["replicas_identical"]))
    # synchronous cells keep equal replicas; dist_async has no such promise (null)
    assert seen == [("mxnet", "dist_async", None), ("mxnet", "dist_sync", True), ("tensorflow", None, True)]


@pytest.mark.slow
def test_a_sweep_runs_as_a_job_array_and_lands_in_duckdb(tmp_path, slurm_cluster, docker_client, torch_image, request):
    name = write_matrix(tmp_path, "[axes]\nlr = [0.01, 0.02]\n")
    proc = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster)
    assert "executor: slurm" in proc.stderr
    assert "--cpus-per-task=1 --time=15 --exclusive --no-requeue" in proc.stderr  # (600 s + 300 s) / 60
    assert "2 runs (2 ok)" in proc.stdout
    rows = sql(tmp_path / "matrun.duckdb", "SELECT status, executor, image_id, accuracy IS NOT NULL, "
                                           "throughput > 0, monitor_samples > 0 FROM runs")
    assert rows == [("ok", "slurm", torch_image.image_id, True, True, True)] * 2
    # One array, two tasks; what the tasks recorded, and Slurm's two records of them agree.
    (sub,) = (tmp_path / "results" / name / ".slurm").iterdir()
    job = json.loads((sub / "job.json").read_text())
    assert job["finalized"] is True and job["sbatch"][:2] == ["--parsable", "--array=0-1"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "results" / name).glob("*/*/slurm.json")]
    assert sorted(r["array_task_id"] for r in records) == [0, 1]
    assert {r["array_job_id"] for r in records} == {job["job_id"]} and {r["node"] for r in records} == {"node0"}
    from matrun.runner.slurm.state import parse_jobcomp

    # The sweep is done once the tasks wrote their results; Slurm ends the jobs after the epilog.
    wait_for(lambda: active_jobs(slurm_cluster, name) == [], 30, "Slurm to end the jobs (their epilog)")
    comp = parse_jobcomp((slurm_cluster.state_dir / "jobcomp.log").read_text(), job_ids=[job["job_id"]])
    live = parse_squeue_json(json.dumps({"jobs": squeue_tasks(slurm_cluster)}), job_ids=[job["job_id"]])
    assert {k: (v.state, v.exit_code) for k, v in comp.items()} == \
        {k: (v.state, v.exit_code) for k, v in live.items()} == {(job["job_id"], 0): ("COMPLETED", 0),
                                                                  (job["job_id"], 1): ("COMPLETED", 0)}
    status = matrun("status", cwd=tmp_path, cluster=slurm_cluster).stdout
    assert "Slurm tasks: queued: 0, running: 0, done: 2, failed: 0" in status
    assert containers_of(docker_client, name) == []
    again = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster)
    assert "0 runs (nothing to run); 2 already done" in again.stdout
    request.getfixturevalue("timeout_sweep")  # the node is free now: start the time-limit test's job


@pytest.fixture(scope="module")
def timeout_sweep(tmp_path_factory, slurm_cluster, torch_image):
    """A long cell whose task's time limit (1 minute, the shortest Slurm has) is far below its
    timeout, submitted detached on CPU 1 beside the other tests; collected by the last test."""
    directory = tmp_path_factory.mktemp("timeout")
    name = write_matrix(directory, fixed={**LONG, "cpuset": "1"}, slurm="exclusive = false\nmax_time = 1\n")
    proc = matrun("sweep", "--detach", cwd=directory, cluster=slurm_cluster)
    assert "--time=1 --no-requeue" in proc.stderr
    return directory, name, time.monotonic()


@pytest.mark.slow
def test_a_gpu_cell_gets_its_fake_gpu_from_slurm(tmp_path, slurm_cluster, torch_image):
    # No CUDA image exists here: the task fails in the docker executor, but only after Slurm
    # scheduled it on a node with GPUs (the submit host has none, and is not asked).
    name = write_matrix(tmp_path, fixed={"device": "gpu", "variant": "cuda", "gpus": 1}, slurm="exclusive = false")
    proc = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster, check=False)
    assert "--gres=gpu:1" in proc.stderr and "1 runs (1 failed)" in proc.stdout
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results" / name).glob("*/*/slurm.json")]
    assert record["gpus"] in ("0", "1")
    (tail,) = sql(tmp_path / "matrun.duckdb", "SELECT error_tail FROM runs")[0]
    assert "no image for torch:cuda built from the current recipe" in tail


def test_a_job_sbatch_refuses_leaves_nothing_behind(tmp_path, slurm_cluster):
    name = write_matrix(tmp_path)
    proc = matrun("sweep", "--partition", "nosuch", cwd=tmp_path, cluster=slurm_cluster, check=False)
    assert proc.returncode == 1
    assert "Error: sbatch refused the job array: sbatch: error: invalid partition specified: nosuch" in proc.stderr
    assert "Batch job submission failed: Invalid partition name specified" in proc.stderr
    assert list((tmp_path / "results" / name).rglob("spec.json")) == []
    assert list((tmp_path / "results" / name / ".slurm").iterdir()) == []


@pytest.mark.slow
def test_cancel_leaves_no_job_and_no_container(tmp_path, slurm_cluster, docker_client, torch_image):
    name = write_matrix(tmp_path, "[axes]\nlr = [0.01, 0.02]\n", fixed=LONG, slurm="exclusive = false\nthrottle = 1")
    with cancelled_at_the_end(tmp_path, slurm_cluster):
        matrun("sweep", "--detach", cwd=tmp_path, cluster=slurm_cluster)
        wait_for(lambda: [c for c in containers_of(docker_client, name) if c.status == "running"], 90,
                 "the first task's container")
        status = matrun("status", cwd=tmp_path, cluster=slurm_cluster).stdout
        assert "Slurm tasks: queued: 1, running: 1, done: 0, failed: 0" in status, status
        proc = matrun("cancel", cwd=tmp_path, cluster=slurm_cluster)
    assert "1 run(s) recorded as cancelled; 0 task(s) still ending" in proc.stdout
    assert active_jobs(slurm_cluster, name) == []
    assert containers_of(docker_client, name) == []
    ((status_, tail),) = sql(tmp_path / "matrun.duckdb", "SELECT status, error_tail FROM runs")
    assert status_ == "cancelled" and "JobState=CANCELLED" in tail
    # The task Slurm never started left nothing behind; the next sweep runs both cells again.
    assert len(list((tmp_path / "results" / name).glob("*/*/spec.json"))) == 1
    assert "nothing to cancel" in matrun("cancel", cwd=tmp_path, cluster=slurm_cluster).stdout


@pytest.mark.slow
def test_the_epilog_removes_the_container_of_a_task_slurm_killed(tmp_path, slurm_cluster, docker_client,
                                                                torch_image):
    # SIGKILL cannot be trapped: the task cannot remove its container; the nodes' Epilog does.
    name = write_matrix(tmp_path, fixed=LONG, slurm="exclusive = false")
    try:
        matrun("sweep", "--detach", cwd=tmp_path, cluster=slurm_cluster)
        (container,) = wait_for(lambda: [c for c in containers_of(docker_client, name) if c.status == "running"],
                                90, "the task's container")
        (record_path,) = (tmp_path / "results" / name).glob("*/*/slurm.json")
        record = json.loads(record_path.read_text())
        assert container.labels["matrun.slurm_job"] == record["job_id"] and record["job_id"].isdigit()
        assert container.labels["matrun.slurm_cluster"] == "matrun"
        os.kill(record["pid"], signal.SIGKILL)  # the task process Slurm started for this test
        wait_for(lambda: active_jobs(slurm_cluster, name) == [], 60, "the job to end (its epilog run)")
        assert containers_of(docker_client, name) == []  # removed by the epilog as the job ended
        # ingest, not sweep (a sweep would run the failed run again as a new attempt), once Slurm's
        # FAILED has stood for the [slurm] grace
        ingest = ("ingest", "results")
        wait_for(lambda: "ingested 1 run(s)" in matrun(*ingest, cwd=tmp_path, cluster=slurm_cluster).stdout, 30,
                 "the run to be recorded")
        ((status, tail),) = sql(tmp_path / "matrun.duckdb", "SELECT status, error_tail FROM runs")
        assert status == "failed" and "killed by signal 9" in tail
    finally:  # a failed run of this test leaves no container running
        for container in containers_of(docker_client, name):
            container.remove(force=True)


@pytest.mark.slow
def test_the_epilog_removes_only_its_own_jobs_containers(tmp_path, docker_client, torch_image):
    from matrun.runner.environments.engine import BASE_IMAGE

    def start(job: str, cluster: str = "matrun"):
        return docker_client.containers.run(BASE_IMAGE, ["sleep", "120"], detach=True, network_mode="none",
                                            labels={"matrun.slurm_job": job, "matrun.slurm_cluster": cluster,
                                                    "matrun.sweep": "epilogtest"})

    mine, other, elsewhere, unlabelled = start("424242"), start("4242420"), start("424242", "othercluster"), None
    try:
        unlabelled = docker_client.containers.run(BASE_IMAGE, ["sleep", "120"], detach=True, network_mode="none")
        proc = subprocess.run([sys.executable, "-m", "matrun.runner.slurm.epilog"], capture_output=True, text=True,
                              env={**os.environ, "SLURM_JOB_ID": "424242", "SLURM_CLUSTER_NAME": "matrun"},
                              timeout=60)
        assert proc.returncode == 0
        assert f"job 424242: removed container {mine.short_id} (sweep epilogtest" in proc.stderr
        left = {c.id for c in docker_client.containers.list(all=True)}
        assert mine.id not in left and {other.id, elsewhere.id, unlabelled.id} <= left
    finally:
        for c in (mine, other, elsewhere, unlabelled):
            if c is not None:
                try:
                    c.remove(force=True)
                except Exception:
                    pass


@pytest.mark.slow
def test_a_task_over_its_time_limit_is_recorded_as_timeout(timeout_sweep, slurm_cluster, docker_client):
    directory, name, submitted = timeout_sweep
    proc = matrun("sweep", cwd=directory, cluster=slurm_cluster, check=False, timeout=200)
    assert proc.returncode == 1, proc.stderr
    # Still running when this test starts (the short tests since the job-array test took less
    # than the minute), or already ended by Slurm (a loaded machine): either way the sweep
    # records it from Slurm's state.
    assert ("1 already queued or running in Slurm" in proc.stderr
            or "caught up: ingested 1 earlier" in proc.stderr), proc.stderr
    assert "1 runs (1 timeout)" in proc.stdout, proc.stdout
    rows = sql(directory / "matrun.duckdb", "SELECT attempt, status, error_tail, wall_seconds FROM runs ORDER BY attempt")
    if "1 already queued or running in Slurm" in proc.stderr:  # this sweep waited for the task
        assert [row[0] for row in rows] == [1]
    else:  # it had ended: caught up, then submitted again as attempt 2, as a timed-out run is (docs/SLURM.md)
        assert [row[0] for row in rows] == [1, 2]
    for _, status, tail, wall in rows:
        assert status == "timeout" and "JobState=TIMEOUT (time limit 1 min)" in tail
        assert wall >= 55  # it ran until its limit (when Slurm then ends it depends on the load: not checked)
    assert containers_of(docker_client, name) == []
    assert active_jobs(slurm_cluster, name) == []


@pytest.mark.slow
def test_ctrl_c_on_a_waiting_sweep_cancels_its_jobs(tmp_path, slurm_cluster, docker_client, torch_image):
    name = write_matrix(tmp_path, fixed=LONG, slurm="exclusive = false")
    with cancelled_at_the_end(tmp_path, slurm_cluster):
        sweep = subprocess.Popen([*MATRUN, "sweep"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, **slurm_cluster.env})
        try:
            wait_for(lambda: [c for c in containers_of(docker_client, name) if c.status == "running"], 90,
                     "the task's container")
            sweep.send_signal(signal.SIGINT)
            out, err = sweep.communicate(timeout=120)
        finally:
            if sweep.poll() is None:
                sweep.kill()
    assert sweep.returncode != 0
    assert "interrupted: cancelling the sweep's Slurm jobs" in err
    assert active_jobs(slurm_cluster, name) == []
    assert containers_of(docker_client, name) == []
    assert sql(tmp_path / "matrun.duckdb", "SELECT status FROM runs") == [("cancelled",)]


@pytest.mark.slow
def test_two_slurm_sweeps_that_share_cells_submit_each_run_once(tmp_path, slurm_cluster, docker_client,
                                                                 torch_image):
    # Two studies with different sweep names and the same cell, on one results directory and one
    # warehouse: the second finds the run queued or running for the first and leaves it to it.
    names = []
    for study in ("a", "b"):
        # 8,192 samples: seconds of training after the container and PyTorch started, long
        # enough to be still queued or running when the second sweep looks a moment later
        names.append(write_matrix(tmp_path / study, fixed={"synthetic_train": 8192},
                                  slurm="exclusive = false"))
        path = tmp_path / study / "matrix.toml"
        path.write_text(path.read_text().replace(
            "timeout = 600\n", 'timeout = 600\nresults = "../results"\nwarehouse = "../w.duckdb"\n', 1))
    matrun("sweep", "--detach", cwd=tmp_path / "a", cluster=slurm_cluster)
    assert active_jobs(slurm_cluster, names[0])  # still queued or running: the cell takes seconds
    second = matrun("sweep", cwd=tmp_path / "b", cluster=slurm_cluster)
    assert "1 runs are queued or running for other sweeps of" in second.stderr, second.stderr
    assert f"({names[0]}): left to them" in second.stderr
    assert active_jobs(slurm_cluster, names[1]) == [] and not (tmp_path / "results" / names[1] / ".slurm").exists()
    wait_for(lambda: not active_jobs(slurm_cluster, names[0]), 180, "the first sweep's task")
    time.sleep(1.2)  # the grace of a task's own result.json
    again = matrun("sweep", cwd=tmp_path / "b", cluster=slurm_cluster)
    assert "1 runs were done by other sweeps" in again.stderr, again.stderr
    # One measurement, made once, in the warehouse both studies share.
    assert sql(tmp_path / "w.duckdb", "SELECT count(*), min(status) FROM runs") == [(1, "ok")]
    assert containers_of(docker_client, names[0]) == []


@pytest.mark.slow
def test_failures_keep_their_exit_codes(tmp_path, slurm_cluster, docker_client, torch_image):
    # A cell whose harness refuses its spec inside the container (exit 2), beside one that works.
    name = write_matrix(tmp_path / "a", "[axes]\nsynthetic_shape = [[1, 4, 4], [1, 28, 28]]\n",
                        slurm="exclusive = false")
    proc = matrun("sweep", cwd=tmp_path / "a", cluster=slurm_cluster, check=False)
    assert proc.returncode == 1 and "2 runs (1 failed, 1 ok)" in proc.stdout
    ((exit_code, tail),) = sql(tmp_path / "a" / "matrun.duckdb",
                               "SELECT exit_code, error_tail FROM runs WHERE status = 'failed'")
    assert exit_code == 2 and "feature map vanishes" in tail
    assert [j["job_state"] for j in squeue_tasks(slurm_cluster) if j["name"] == f"matrun-{name}"].count("FAILED") == 1
    # A task that dies before it can write its result (no such interpreter on the node): Slurm's
    # exit code and the task's log.  Submitted detached; `matrun ingest` records it from Slurm.
    name = write_matrix(tmp_path / "b", slurm='exclusive = false\npython = "/nonexistent/bin/python3"')
    matrun("sweep", "--detach", cwd=tmp_path / "b", cluster=slurm_cluster)
    results = tmp_path / "b" / "results"
    wait_for(lambda: not active_jobs(slurm_cluster, name), 60, "the task to fail")
    time.sleep(1.2)  # grace: a task's own result.json may arrive late on a shared file system
    ingested = matrun("ingest", str(results), "--warehouse", str(tmp_path / "b.duckdb"), cwd=tmp_path,
                      cluster=slurm_cluster)
    assert "recorded 1 run(s) Slurm ended from Slurm's state" in ingested.stderr
    ((status, exit_code, executor, tail),) = sql(tmp_path / "b.duckdb",
                                                 "SELECT status, exit_code, executor, error_tail FROM runs")
    assert (status, exit_code, executor) == ("failed", 127, "slurm")
    assert "/nonexistent/bin/python3: not found" in tail
    assert "JobState=FAILED, exit code 127; the task ended without writing result.json" in tail


@pytest.mark.slow
def test_detach_then_a_later_sweep_picks_the_runs_up(tmp_path, slurm_cluster, docker_client, torch_image):
    name = write_matrix(tmp_path, fixed={"synthetic_train": 8192}, slurm="exclusive = false")
    proc = matrun("sweep", "--detach", cwd=tmp_path, cluster=slurm_cluster)  # returns at once: `early` sees it running
    assert "submitted 1 runs as Slurm job" in proc.stdout and "matrun cancel" in proc.stdout
    early = matrun("ingest", "results", cwd=tmp_path, cluster=slurm_cluster)  # the task has not ended yet
    assert "1 run(s) still queued or running in Slurm" in early.stderr
    assert "ingested 0 run(s), 0 unchanged, 0 skipped, 1 incomplete" in early.stdout
    later = matrun("sweep", cwd=tmp_path, cluster=slurm_cluster)
    assert "0 runs to do, 0 already done, 1 already queued or running in Slurm" in later.stderr
    assert "1 runs (1 ok)" in later.stdout
    assert len(list((tmp_path / "results" / name / ".slurm").iterdir())) == 1  # nothing submitted twice
    assert sql(tmp_path / "matrun.duckdb", "SELECT status, executor FROM runs") == [("ok", "slurm")]
    assert containers_of(docker_client, name) == []


def test_doctor_sees_the_cluster_up_and_a_partition_it_lacks(tmp_path, monkeypatch, slurm_cluster):
    """`matrun doctor --executor slurm` on the test cluster (here, beside the cluster's other
    tests, so that one worker holds the one cluster: tests/conftest.py)."""
    from test_doctor import as_json, by_name, write

    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    code, doc = as_json("--executor", "slurm", env=slurm_cluster.env)
    checks = by_name(doc)
    assert checks["slurm-client"]["status"] == "ok"
    assert checks["slurm-controller"]["status"] == "ok" and " is UP" in checks["slurm-controller"]["found"]
    assert checks["slurm-partition"]["status"] == "ok" and "multi" in checks["slurm-partition"]["found"]
    assert code == 0 and doc["ok"] is True
    write(tmp_path, sweep='\n[slurm]\npartition = "nosuch"\npython = "/nonexistent/python3"')
    code, doc = as_json("--executor", "slurm", env=slurm_cluster.env)
    checks = by_name(doc)
    assert code == 1 and checks["slurm-partition"]["status"] == "fail"
    assert "names nosuch, which the cluster does not have" in checks["slurm-partition"]["found"]
    assert checks["slurm-python"]["status"] == "fail"
