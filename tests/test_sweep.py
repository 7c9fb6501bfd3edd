"""End to end: the `matrun` CLI on real matrices, real harness subprocesses, a real DuckDB
file and a real report; resume after SIGKILL; bad input that runs nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lake_client import plain_connect
from matrun.runner.executors.energy import rapl_zones
from matrun.warehouse.ingest import ingest

MATRUN = [str(Path(sys.executable).with_name("matrun"))]

TINY = """
[sweep]
name = "tiny"
repeats = 2
timeout = 300

[fixed]
dataset = "synthetic"
synthetic_train = 128
synthetic_test = 64
epochs = 2
batch_size = 32
warmup_steps = 2
# The oneDNN check runs the harness a second time per run (tests/test_harness.py covers it);
# nothing here reads its fields.
onednn_check = false

[axes]
threads = [1, 2]
"""


# These tests exercise the embedded default: `--executor auto` must find no Docker engine
# (CI runs one for the docker tests, tests/test_docker_sweep.py).
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}


def matrun(*args: str, cwd: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw["env"] = {**os.environ, **NO_ENGINE, **kw.get("env", {})}
    proc = subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"matrun {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def sql(db: Path, query: str) -> list[tuple]:
    con = plain_connect(db)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.scripts: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "script":
            self.scripts.append(dict(attrs).get("src") or "")
        if tag == "a":
            self.links.append(dict(attrs).get("href") or "")

    def handle_data(self, data):
        self.text.append(data)


@pytest.mark.slow
def test_sweep_ingest_query_report_and_skip_done(tmp_path, torch_env):
    (tmp_path / "matrix.toml").write_text(TINY)
    plan = matrun("plan", cwd=tmp_path)
    assert "2 cells × 2 repeats" in plan.stdout and "4 runs: 0 done, 4 to run" in plan.stdout

    first = matrun("sweep", cwd=tmp_path)
    assert "sweep tiny: 4 runs (4 ok); 0 already done" in first.stdout
    db = tmp_path / "matrun.duckdb"
    assert sql(db, "SELECT status, count(*) FROM runs GROUP BY status") == [("ok", 4)]
    rows = sql(db, "SELECT threads, runs, accuracy_median, throughput_median FROM baseline ORDER BY threads")
    assert [(r[0], r[1]) for r in rows] == [("1", 2), ("2", 2)]
    assert all(0 <= r[2] <= 1 and r[3] > 0 for r in rows)
    assert sql(db, "SELECT count(DISTINCT epoch) FROM epochs") == [(2,)]
    assert sql(db, "SELECT count(*) > 0 FROM monitor_samples") == [(True,)]
    # Each run records the machine state before it started and the images it trained; this CPU
    # host has no NVML and no RAPL: its energy is unmeasured (NULL), never 0.
    assert sql(db, "SELECT count(*) FROM runs WHERE busy_start IS NOT NULL AND (host -> 'state' ->> 'cpu_model') "
                   "IS NOT NULL AND TRY_CAST(host -> 'state' ->> 'cell_cpus' AS INT) >= 1 "
                   "AND TRY_CAST(summary ->> 'images' AS INT) = 2 * 128 AND gpu_energy_j IS NULL "
                   "AND (host -> 'gpu') IS NULL") == [(4,)]
    rapl = bool(rapl_zones())
    assert sql(db, "SELECT count(*) FROM runs WHERE cpu_energy_j IS NOT NULL") == [(4 if rapl else 0,)]

    # Nothing left: a second sweep runs nothing and duplicates nothing.
    again = matrun("sweep", cwd=tmp_path)
    assert "sweep tiny: 0 runs (nothing to run); 4 already done" in again.stdout
    assert sql(db, "SELECT count(*) FROM runs") == [(4,)]
    status = matrun("status", cwd=tmp_path)
    assert "complete: 2" in status.stdout

    # Changing one parameter of one cell re-runs only that cell.
    (tmp_path / "matrix.toml").write_text(TINY.replace("threads = [1, 2]", "threads = [1, 2]\n[[include]]\nthreads = 2\nseed = 5"))
    # The plan estimates the rest from the earlier runs' wall times.
    replan = matrun("plan", cwd=tmp_path).stdout
    assert re.search(r"6 runs: 4 done, 2 to run; estimated time for the rest: 0m\d\ds", replan), replan
    third = matrun("sweep", cwd=tmp_path)
    assert "sweep tiny: 2 runs (2 ok); 4 already done" in third.stdout

    csv_out = matrun("query", "SELECT threads, runs FROM baseline WHERE sweep = 'tiny' ORDER BY threads, runs",
                     "--format", "csv", cwd=tmp_path)
    assert csv_out.stdout.splitlines() == ["threads,runs", "1,2", "2,2", "2,2"]
    as_json = json.loads(matrun("query", "SELECT count(*) AS n FROM runs", "-f", "json", cwd=tmp_path).stdout)
    assert as_json == [{"n": 6}]

    rep = matrun("report", "--out", "site", cwd=tmp_path)
    index = Path(rep.stdout.strip().split("report: ", 1)[1])
    assert index == (tmp_path / "site" / "index.html").resolve()
    parser = _Tables()
    parser.feed(index.read_text(encoding="utf-8"))
    assert "baseline.html" in "".join(parser.links)  # the index links every page present
    baseline = _Tables()
    baseline.feed((tmp_path / "site" / "baseline.html").read_text(encoding="utf-8"))
    assert "table" in baseline.tags
    assert "assets/plotly.min.js" in baseline.scripts
    assert (tmp_path / "site" / "assets" / "plotly.min.js").stat().st_size > 1_000_000


@pytest.mark.slow
def test_real_fashion_mnist_slice(tmp_path, torch_env, fashion_mnist_root):
    (tmp_path / "matrix.toml").write_text(f"""
[sweep]
name = "fashion-slice"
data_dir = "{fashion_mnist_root}"
[fixed]
dataset = "fashion-mnist"
train_limit = 3000
test_limit = 500
epochs = 2
batch_size = 32
threads = 2
onednn_check = false
""")
    out = matrun("sweep", cwd=tmp_path)
    assert "1 runs (1 ok)" in out.stdout
    ((acc, train_s, n_test),) = sql(tmp_path / "matrun.duckdb",
                                    "SELECT accuracy, train_seconds, test_seconds FROM run_overview")
    assert acc > 0.6  # 10 classes: chance is 0.1
    assert train_s > 0 and n_test > 0


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


SLOW_SECOND_CELL = """
[sweep]
name = "{name}"
[fixed]
dataset = "synthetic"
synthetic_test = 64
epochs = 1
batch_size = 32
warmup_steps = 1
threads = 1
onednn_check = false
[[zip]]
seed = {seeds}
synthetic_train = {sizes}
"""


def interrupt_second_cell(tmp_path: Path, name: str, sig: int, *, cells: int) -> tuple[subprocess.Popen, Path, int]:
    """Start `matrun sweep` on cells whose second one is slow; send ``sig`` while it runs.

    Returns the sweep process (ended), the interrupted run's directory and its cell's pid.
    """
    sizes = [128, 20000, 160][:cells]  # the second trains for seconds: still running 1 s after it starts
    (tmp_path / "matrix.toml").write_text(SLOW_SECOND_CELL.format(name=name, seeds=list(range(1, cells + 1)),
                                                                  sizes=sizes))
    sweep = subprocess.Popen([*MATRUN, "sweep"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, **NO_ENGINE})
    results = tmp_path / "results" / name

    def second_running():
        done = list(results.glob("*/*/result.json"))
        monitors = [m for m in results.glob("*/*/monitor.jsonl") if not (m.parent / "result.json").exists()]
        return monitors[0] if len(done) == 1 and monitors and monitors[0].stat().st_size > 0 else None

    try:
        try:
            monitor = wait_for(second_running, 120, "the second cell to start")
        except AssertionError:
            sweep.kill()
            raise AssertionError(sweep.communicate()[1].decode()) from None
        time.sleep(1.0)
        cell_pid = json.loads(monitor.read_text().splitlines()[0])["pid"]
        sweep.send_signal(sig)
        sweep.wait(20)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        sweep.communicate()
    return sweep, monitor.parent, cell_pid


@pytest.mark.slow
def test_sigkill_mid_cell_then_resume(tmp_path, torch_env):
    _, interrupted, cell_pid = interrupt_second_cell(tmp_path, "resume", signal.SIGKILL, cells=3)
    # The cell dies with the sweep (PR_SET_PDEATHSIG), it does not keep training unseen.
    wait_for(lambda: not Path(f"/proc/{cell_pid}").exists() or
              "Z" in Path(f"/proc/{cell_pid}/stat").read_text().split()[2], 10, "the orphaned cell to die")
    assert not (interrupted / "result.json").exists()

    resumed = matrun("sweep", cwd=tmp_path)
    assert "sweep resume: 2 runs (2 ok); 1 already done" in resumed.stdout
    db = tmp_path / "matrun.duckdb"
    assert sql(db, "SELECT count(*), count(DISTINCT cell_id), min(status), max(status) FROM runs") == [(3, 3, "ok", "ok")]
    # The interrupted cell ran again as attempt 2; attempt 1 stays on disk, unfinished, never ingested.
    cell = interrupted.parent.name
    assert sql(db, f"SELECT attempt FROM runs WHERE cell_id = '{cell}'") == [(2,)]
    assert (interrupted.parent / "0-2" / "result.json").exists()
    report = ingest([tmp_path / "results"], warehouse=db)
    assert report.incomplete == [interrupted] and not report.ingested


def test_bad_matrix_exits_2_and_runs_nothing(tmp_path):
    (tmp_path / "matrix.toml").write_text('[axes]\nbatch_size = [64, "$(reboot)"]\n')
    for command in ("plan", "sweep", "status"):
        proc = matrun(command, cwd=tmp_path, check=False)
        assert proc.returncode == 2
        assert proc.stderr.strip() == ('Error: matrix.toml: [axes -> batch_size -> 1] expected a positive integer, '
                                       'got "$(reboot)"')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.toml"]


def test_missing_dataset_is_a_clear_error_before_anything_runs(tmp_path):
    (tmp_path / "matrix.toml").write_text(f'[sweep]\ndata_dir = "{tmp_path / "data"}"\n[fixed]\ndataset = "fashion-mnist"\n')
    proc = matrun("sweep", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "Error: dataset 'fashion-mnist': dataset directory not found" in proc.stderr
    assert "apt-get install dataset-fashion-mnist" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_cpuset_the_host_lacks_is_refused(tmp_path):
    (tmp_path / "matrix.toml").write_text('[fixed]\ndataset = "synthetic"\ncpuset = "0,4095"\n')
    proc = matrun("sweep", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "names CPUs this host does not offer (4095)" in proc.stderr


@pytest.fixture(scope="module")
def one_run_warehouse(tmp_path_factory) -> Path:
    """A folder with a warehouse of one run, ingested by the CLI: the hostile queries' target
    (each query checks that the run is still there, and only there, after it)."""
    from bundle_factory import make_bundle

    root = tmp_path_factory.mktemp("hostile")
    make_bundle(root / "results")
    matrun("ingest", "results", "--warehouse", "w.duckdb", cwd=root)
    return root


@pytest.mark.parametrize("query, message", [
    ("", "Error: "),
    ("DROP TABLE runs", "Error: query failed: "),
    ("SELEC 1", "Error: query failed: "),
    ("COPY runs TO '/tmp/matrun-stolen.csv'", "Error: query failed: "),
    ("SELECT * FROM read_csv('/etc/passwd')", "Error: query failed: "),
])
def test_hostile_or_broken_sql_from_the_cli(one_run_warehouse, query, message):
    tmp_path = one_run_warehouse
    assert sql(tmp_path / "w.duckdb", "SELECT count(*) FROM runs") == [(1,)]
    proc = matrun("query", query, "--warehouse", "w.duckdb", cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith(message)
    assert sql(tmp_path / "w.duckdb", "SELECT count(*) FROM runs") == [(1,)]
    assert not Path("/tmp/matrun-stolen.csv").exists()


def test_ingest_cli_reports_corrupt_bundles_and_loads_the_rest(tmp_path):
    from bundle_factory import make_bundle

    make_bundle(tmp_path / "results", cell_id="a" * 16)
    bad = make_bundle(tmp_path / "results", cell_id="b" * 16)
    (bad / "result.json").write_text('{"schema_version": 1, "status": ')
    half = make_bundle(tmp_path / "results", cell_id="c" * 16, with_result=False)
    proc = matrun("ingest", "results", "--warehouse", "w.duckdb", cwd=tmp_path, check=False)
    assert proc.returncode == 1  # something was skipped: a script must not read this as success
    assert f"skipped {bad}" in proc.stderr and "result.json" in proc.stderr
    assert f"incomplete (no result.json yet): {half}" in proc.stderr
    assert sql(tmp_path / "w.duckdb", "SELECT cell_id FROM runs") == [("a" * 16,)]
    matrun("ingest", "results", "--warehouse", "w.duckdb", "--allow-skipped", cwd=tmp_path)
    assert sql(tmp_path / "w.duckdb", "SELECT count(*) FROM runs") == [(1,)]


@pytest.mark.slow
def test_same_cell_in_two_sweeps_and_force(tmp_path, torch_env):
    cell = ('[fixed]\ndataset = "synthetic"\nsynthetic_train = 64\nsynthetic_test = 32\n'
            'batch_size = 32\nwarmup_steps = 1\nthreads = 1\nonednn_check = false\n')
    (tmp_path / "a.toml").write_text('[sweep]\nname = "a"\n' + cell)
    (tmp_path / "b.toml").write_text('[sweep]\nname = "b"\n' + cell)
    assert "sweep a: 1 runs (1 ok); 0 already done" in matrun("sweep", "a.toml", cwd=tmp_path).stdout
    # Done-ness follows the cell's identity, whichever sweep ran it.
    assert "sweep b: 0 runs (nothing to run); 1 already done" in matrun("sweep", "b.toml", cwd=tmp_path).stdout
    # --force runs it again as the next attempt: a new run, never a clash with sweep a's.
    assert "sweep b: 1 runs (1 ok)" in matrun("sweep", "b.toml", "--force", cwd=tmp_path).stdout
    assert sql(tmp_path / "matrun.duckdb", "SELECT sweep, attempt, status FROM runs ORDER BY attempt") == [
        ("a", 1, "ok"), ("b", 2, "ok")]


@pytest.mark.slow
def test_sigterm_cancels_the_running_cell_and_keeps_finished_runs(tmp_path, torch_env):
    sweep, interrupted, cell_pid = interrupt_second_cell(tmp_path, "term", signal.SIGTERM, cells=2)
    assert sweep.returncode != 0
    results = tmp_path / "results" / "term"
    assert not Path(f"/proc/{cell_pid}").exists()
    result = json.loads((interrupted / "result.json").read_text())
    assert result["status"] == "cancelled"
    statuses = sorted(json.loads(p.read_text())["status"] for p in results.glob("*/*/result.json"))
    assert statuses == ["cancelled", "ok"]
    # The next sweep ingests the cancelled run and runs that cell again.
    resumed = matrun("sweep", cwd=tmp_path)
    assert "sweep term: 1 runs (1 ok); 1 already done" in resumed.stdout
    assert sql(tmp_path / "matrun.duckdb", "SELECT status, attempt FROM runs ORDER BY status, attempt") == [
        ("cancelled", 1), ("ok", 1), ("ok", 2)]


@pytest.mark.slow
def test_layer_profile_and_inference_cells_land_in_the_warehouse(tmp_path, torch_env):
    (tmp_path / "matrix.toml").write_text("""
[sweep]
name = "layers"
[fixed]
dataset = "synthetic"
synthetic_train = 128
synthetic_test = 64
batch_size = 32
warmup_steps = 1
threads = 1
onednn_check = false
[[include]]
layer_profile = true
[[include]]
mode = "inference"
iterations = 6
""")
    assert "3 runs (3 ok)" in matrun("sweep", cwd=tmp_path).stdout  # the plain cell and two includes
    db = tmp_path / "matrun.duckdb"
    layers = sql(db, "SELECT name, kind, forward_s_median > 0, backward_s_median > 0, flops FROM layer_breakdown "
                     "ORDER BY layer_index")
    assert [row[0] for row in layers] == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten",
                                          "fc1", "relu3", "fc2", "relu4", "fc3"]
    assert all(fwd and bwd for _, _, fwd, bwd, _ in layers)
    assert layers[0][4] == 2 * 1 * 6 * 5 * 5 * 28 * 28  # conv1's FLOPs per sample, as models.walk says
    ((mode, acc, ips, inf_s),) = sql(db, "SELECT mode, accuracy, throughput, inference_seconds FROM run_overview "
                                         "WHERE mode = 'inference'")
    assert acc is None and ips > 0 and inf_s > 0
