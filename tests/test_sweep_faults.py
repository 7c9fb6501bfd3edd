"""The sweep under faults, for real: two `matrun sweep` processes sharing cells and one results
directory, a deleted warehouse rebuilt by one study while another shares its cells, a results
disk (a real tmpfs) full before and during a cell, read-only and impossible result paths, and
the exit codes a script reads when bundles were skipped."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from bundle_factory import make_bundle
from test_sweep import sql, wait_for

from matrun.errors import InputError, MatrunError
from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.sweep.records import RunClaim, ok_runs_on_disk, path_error, short_path
from matrun.warehouse.bundles.write import next_attempt, write_json_atomic

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}

# Two tiny real cells; ``{name}`` and ``{extra}`` make the studies that share them.
SHARED = """
[sweep]
name = "{name}"
{extra}
[fixed]
dataset = "synthetic"
synthetic_test = 32
epochs = 1
batch_size = 32
warmup_steps = 1
threads = 1
onednn_check = false
[[zip]]
seed = {seeds}
synthetic_train = {sizes}
"""


def study(path: Path, name: str, *, seeds=(1, 2), sizes=(64, 64), extra: str = "") -> Path:
    path.write_text(SHARED.format(name=name, extra=extra, seeds=list(seeds), sizes=list(sizes)))
    return path


def matrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE})


def start(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([*MATRUN, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **NO_ENGINE})


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def results_on_disk(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*/*/*/result.json"))]


def planned_ids(matrix: Path) -> list[str]:
    runner, _ = get_executor("local")
    return [pc.cell_id for pc in plan_cells(load_matrix(matrix), runner.env_id)]


def no_traceback(proc_err: str) -> None:
    assert "Traceback" not in proc_err and "Exception in thread" not in proc_err, proc_err



@contextmanager
def tmpfs(where: Path, size: str, *options: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler file (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: nothing left to flush on close
        try:
            while fh.write(b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


# -- attempts, claims, the disk scan (real files and processes, no cells) ---------------------


def test_attempts_are_numbered_across_every_sweep_of_the_results_directory(tmp_path):
    results = tmp_path / "results"
    assert next_attempt(results, "c" * 16, 0) == 1  # no results directory yet
    for sweep, run in (("a", "0-1"), ("b", "0-2"), ("b", "1-7"), ("c", "0-3")):
        (results / sweep / ("c" * 16) / run).mkdir(parents=True)
    (results / ".claims").mkdir()
    (results / "notes.txt").write_text("not a sweep")
    (results / "a" / ("c" * 16) / "0-x").mkdir()  # not a run directory
    assert next_attempt(results, "c" * 16, 0) == 4  # a's 1, b's 2, c's 3: one numbering for all
    assert next_attempt(results, "c" * 16, 1) == 8
    assert next_attempt(results, "d" * 16, 0) == 1


def test_a_claim_excludes_other_processes_and_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from matrun.runner.sweep.records import RunClaim; "
         "c = RunClaim(Path(sys.argv[1]), 'c' * 16, 0, 'other'); assert c.take(wait=False); "
         "print('held', flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        claim = RunClaim(tmp_path, "c" * 16, 0, "mine")
        assert not claim.take(wait=False)
        assert claim.holder() == f"pid {holder.pid}, sweep 'other'"
        assert RunClaim(tmp_path, "c" * 16, 1, "mine").take(wait=False)  # another repeat is free
        holder.send_signal(signal.SIGKILL)  # a sweep killed with -9 leaves no claim behind
        holder.wait(10)
        assert claim.take(wait=False)
        assert claim.holder() == f"pid {os.getpid()}, sweep 'mine'"
        claim.release()
        assert claim.holder() == "another sweep" and RunClaim(tmp_path, "c" * 16, 0, "x").take(wait=False)
    finally:
        holder.kill()
        holder.wait()


def test_ok_runs_on_disk_reads_every_sweep_and_trusts_only_an_ok_result(tmp_path):
    results = tmp_path / "results"
    ok_a = make_bundle(results, sweep="a", cell_id="c" * 16, attempt=1)
    make_bundle(results, sweep="b", cell_id="c" * 16, attempt=2, status="failed", exit_code=1)
    make_bundle(results, sweep="b", cell_id="c" * 16, attempt=3, with_result=False)
    ok_c = make_bundle(results, sweep="c", cell_id="c" * 16, attempt=4)
    make_bundle(results, sweep="c", cell_id="c" * 16, repeat=1, attempt=1)
    broken = make_bundle(results, sweep="d", cell_id="c" * 16, attempt=5)
    (broken / "result.json").write_text('{"status": "ok"')  # cut off: not trusted
    listed = make_bundle(results, sweep="e", cell_id="c" * 16, attempt=6)
    (listed / "result.json").write_text('["ok"]')
    assert ok_runs_on_disk(results, "c" * 16, 0) == [ok_a, ok_c]
    assert ok_runs_on_disk(tmp_path / "nowhere", "c" * 16, 0) == []


def test_path_errors_name_the_path_and_shorten_a_huge_one():
    full = path_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "/r/demo/c/0-1/result.json")
    assert type(full) is MatrunError and full.exit_code == 1
    assert str(full) == ("no space left on device: /r/demo/c/0-1/result.json (every finished run is kept; "
                         "free some space and run the sweep again)")
    long = "/r/" + "x" * 5_000_000
    too_long = path_error(OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), long))
    assert isinstance(too_long, InputError) and too_long.exit_code == 2
    assert str(too_long).startswith("file name too long: /r/xxx") and str(too_long).endswith(
        "(5000003 characters)") and len(str(too_long)) < 300
    assert short_path("/short") == "/short"


def test_an_atomic_write_on_a_full_disk_names_its_file_and_leaves_no_temporary(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as disk:
        write_json_atomic(disk / "kept.json", {"a": 1})
        fill(disk)
        with pytest.raises(OSError) as caught:
            write_json_atomic(disk / "result.json", {"b": "x" * 10_000})
        assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(disk / "result.json")
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "kept.json"]
        assert json.loads((disk / "kept.json").read_text()) == {"a": 1}


# -- bad result paths: an Error line naming the path, never a traceback -----------------------


def test_results_on_a_read_only_disk_or_under_a_file_is_an_error_naming_the_path(tmp_path):
    (tmp_path / "afile").write_text("")
    with tmpfs(tmp_path / "ro", "64k", "ro"):
        for results, message in ((tmp_path / "ro" / "results", f"read-only file system: {tmp_path}/ro/results"),
                                 (tmp_path / "afile", f"not a directory: {tmp_path}/afile/s"),
                                 (tmp_path / "afile" / "deeper", f"not a directory: {tmp_path}/afile/deeper/s")):
            study(tmp_path / "m.toml", "s", extra=f'results = "{results}"\nwarehouse = "w.duckdb"')
            proc = matrun("sweep", "m.toml", cwd=tmp_path)
            no_traceback(proc.stderr)
            assert proc.returncode == 1, proc.stderr
            assert proc.stderr.splitlines()[-1] == f"Error: {message}"
    assert not (tmp_path / "w.duckdb").exists()


def test_a_huge_results_path_or_warehouse_name_is_an_error_not_a_traceback(tmp_path):
    """matrix.py may refuse these first; either way: one short Error line, exit 2."""
    for extra in (f'results = "{"r/" * 2_500_000}"', f'warehouse = "{"w" * 300}.duckdb"'):
        study(tmp_path / "m.toml", "s", extra=extra)
        proc = matrun("sweep", "m.toml", cwd=tmp_path)
        no_traceback(proc.stderr)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.splitlines()[-1].startswith("Error: ") and len(proc.stderr) < 2000


# -- exit codes: skipped bundles (catch-up included) ------------------------------------------


def test_sweep_exits_1_when_a_bundle_was_skipped_unless_allow_skipped(tmp_path):
    matrix = study(tmp_path / "matrix.toml", "s", seeds=(1,), sizes=(64,))
    (cell,) = planned_ids(matrix)
    results = tmp_path / "results"
    make_bundle(results, sweep="s", cell_id=cell)  # the one cell: done, nothing runs
    bad = make_bundle(results, sweep="s", cell_id="b" * 16)
    (bad / "result.json").write_text('{"schema_version": 1, "status": ')
    proc = matrun("sweep", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "sweep s: 0 runs (nothing to run); 1 already done" in proc.stdout
    assert "warehouse: ingested 1 run(s), 0 unchanged, 1 skipped" in proc.stdout
    assert f"skipped {bad}: result.json" in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "Error: 1 bundle(s) skipped (reasons above); they stay on disk and are not in the warehouse, and every "
        f"later sweep skips them again: `matrun ingest --quarantine --warehouse {tmp_path / 'matrun.duckdb'} "
        f"{results / 's'}` sets them aside (--allow-skipped exits 0 all the same)")
    lenient = matrun("sweep", "--allow-skipped", cwd=tmp_path)
    assert lenient.returncode == 0, lenient.stderr
    assert "warehouse: ingested 0 run(s), 1 unchanged, 1 skipped" in lenient.stdout
    assert f"skipped {bad}: result.json" in lenient.stderr and "Error" not in lenient.stderr
    bad.joinpath("result.json").unlink()  # now an unfinished run: not a skip
    assert matrun("sweep", cwd=tmp_path).returncode == 0


def test_ok_bundles_of_another_sweep_count_as_done_after_the_warehouse_is_deleted(tmp_path):
    """Study a's bundles are on disk, the warehouse is gone: study b, sharing a's cells, ingests
    a's bundles instead of running the cells again, and a's next sweep finds them unchanged."""
    a = study(tmp_path / "a.toml", "a")
    study(tmp_path / "b.toml", "b")
    for cell in planned_ids(a):
        make_bundle(tmp_path / "results", sweep="a", cell_id=cell)
    b = matrun("sweep", "b.toml", cwd=tmp_path)
    assert b.returncode == 0, b.stderr
    assert "sweep b: 0 runs (nothing to run); 2 already done" in b.stdout
    assert "warehouse: ingested 2 run(s), 0 unchanged, 0 skipped" in b.stdout
    assert f"2 runs were done by other sweeps of {tmp_path / 'results'}" in b.stderr
    again = matrun("sweep", "a.toml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "warehouse: ingested 0 run(s), 2 unchanged, 0 skipped" in again.stdout
    assert sql(tmp_path / "matrun.duckdb", "SELECT sweep, count(*) FROM runs GROUP BY sweep") == [("a", 2)]
    assert list((tmp_path / "results" / "b").glob("*/*")) == []


# -- real sweeps: concurrent studies, a rebuilt warehouse, a full disk -----------------------


def assert_each_run_once(tmp_path: Path, cells: int, db: Path) -> None:
    """Every (cell, repeat) has exactly one run on disk, ok, and the warehouse holds each once."""
    results = results_on_disk(tmp_path / "results")
    assert sorted((r["cell_id"], r["repeat"]) for r in results) == sorted(
        {(r["cell_id"], r["repeat"]) for r in results})
    assert len(results) == cells and all(r["status"] == "ok" for r in results)
    assert sql(db, "SELECT count(*), count(DISTINCT run_id), count(DISTINCT cell_id), min(status) FROM runs") == [
        (cells, cells, cells, "ok")]


@pytest.mark.slow
def test_two_sweeps_started_together_run_each_shared_cell_once(tmp_path, torch_env):
    study(tmp_path / "a.toml", "a")
    study(tmp_path / "b.toml", "b")
    procs = [start("sweep", "a.toml", cwd=tmp_path), start("sweep", "b.toml", cwd=tmp_path)]
    ended = [finish(p) for p in procs]
    for rc, out, err in ended:
        no_traceback(err)
        assert rc == 0, out + err
        assert "conflict" not in err and "skipped" not in err
        assert "warehouse:" in out and " 0 skipped" in out
    assert_each_run_once(tmp_path, 2, tmp_path / "matrun.duckdb")
    ran = sum(int(out.split(" runs (")[0].rsplit(" ", 1)[1]) for _, out, _ in ended)
    assert ran == 2  # each cell once, whichever sweep ran it
    for name in ("a", "b"):
        again = matrun("sweep", f"{name}.toml", cwd=tmp_path)
        assert again.returncode == 0 and f"sweep {name}: 0 runs (nothing to run); 2 already done" in again.stdout


@pytest.mark.slow
def test_a_sweep_waits_for_the_cell_another_sweep_is_running(tmp_path, torch_env):
    """Sweep a starts a slow cell; sweep b, sharing it, runs the other cell first, then waits
    for a's and takes a's run; a then finds b's run of the second cell."""
    study(tmp_path / "a.toml", "a", sizes=(12000, 64))
    study(tmp_path / "b.toml", "b", sizes=(12000, 64))
    slow = planned_ids(tmp_path / "a.toml")[0]
    a = start("sweep", "a.toml", cwd=tmp_path)
    try:
        wait_for(lambda: list((tmp_path / "results" / "a" / slow).glob("0-1/monitor.jsonl")), 120,
                 "sweep a to start its slow cell")
        b = start("sweep", "b.toml", cwd=tmp_path)
        rc_b, out_b, err_b = finish(b)
    finally:
        rc_a, out_a, err_a = finish(a)
    assert rc_a == 0 and rc_b == 0, err_a + err_b
    no_traceback(err_a + err_b)
    assert f"cell {slow} repeat 0: running in pid {a.pid}, sweep 'a'; coming back to it at the end" in err_b
    assert f"done  {slow}  repeat 0  (done by another sweep meanwhile)" in err_b
    assert "sweep b: 1 runs (1 ok); 1 already done (1 by another sweep meanwhile)" in out_b
    assert "sweep a: 1 runs (1 ok); 1 already done (1 by another sweep meanwhile)" in out_a
    assert_each_run_once(tmp_path, 2, tmp_path / "matrun.duckdb")
    assert {(r["sweep"], r["cell_id"], r["attempt"]) for r in results_on_disk(tmp_path / "results")} == {
        ("a", slow, 1), ("b", planned_ids(tmp_path / "b.toml")[1], 1)}


@pytest.mark.slow
def test_a_sweep_killed_while_another_waits_for_its_cell_leaves_no_claim(tmp_path, torch_env):
    """kill -9 of the sweep running a shared cell: the kernel drops its claim, the sweep that
    waited runs the cell itself as the next attempt, and the killed study's next sweep runs
    nothing."""
    study(tmp_path / "a.toml", "a", sizes=(30000, 64))
    study(tmp_path / "b.toml", "b", sizes=(30000, 64))
    slow, fast = planned_ids(tmp_path / "a.toml")
    a = start("sweep", "a.toml", cwd=tmp_path)
    b = None
    try:
        wait_for(lambda: list((tmp_path / "results" / "a" / slow).glob("0-1/monitor.jsonl")), 120,
                 "sweep a to start its slow cell")
        b = start("sweep", "b.toml", cwd=tmp_path)
        wait_for(lambda: (tmp_path / "results" / "b" / fast / "0-1" / "result.json").exists(), 120,
                 "sweep b to run the other cell first")
        assert not (tmp_path / "results" / "a" / slow / "0-1" / "result.json").exists()
        a.send_signal(signal.SIGKILL)
        rc_b, out_b, err_b = finish(b)
    finally:
        finish(a)
        if b is not None and b.poll() is None:
            finish(b)
    assert rc_b == 0, out_b + err_b
    no_traceback(err_b)
    assert "sweep b: 2 runs (2 ok); 0 already done" in out_b
    assert {(r["sweep"], r["cell_id"], r["attempt"]) for r in results_on_disk(tmp_path / "results")} == {
        ("b", fast, 1), ("b", slow, 2)}  # a's killed attempt 1 stays unfinished; b's is attempt 2
    again = matrun("sweep", "a.toml", cwd=tmp_path)
    assert again.returncode == 0 and "sweep a: 0 runs (nothing to run); 2 already done" in again.stdout
    assert_each_run_once(tmp_path, 2, tmp_path / "matrun.duckdb")


@pytest.mark.slow
def test_a_deleted_warehouse_rebuilt_by_one_study_then_the_other_swept(tmp_path, torch_env):
    study(tmp_path / "a.toml", "a")
    study(tmp_path / "b.toml", "b", seeds=(1, 2, 3), sizes=(64, 64, 64))  # a's two cells and one more
    db = tmp_path / "matrun.duckdb"
    assert "sweep a: 2 runs (2 ok)" in matrun("sweep", "a.toml", cwd=tmp_path).stdout
    assert "sweep b: 1 runs (1 ok); 2 already done" in matrun("sweep", "b.toml", cwd=tmp_path).stdout
    for first, second in (("a", "b"), ("b", "a")):
        shutil.rmtree(db)  # the warehouse, deleted
        one = matrun("sweep", f"{first}.toml", cwd=tmp_path)
        other = matrun("sweep", f"{second}.toml", cwd=tmp_path)
        for proc, name, done in ((one, first, 2 if first == "a" else 3), (other, second, 2 if second == "a" else 3)):
            assert proc.returncode == 0, proc.stdout + proc.stderr
            no_traceback(proc.stderr)
            assert f"sweep {name}: 0 runs (nothing to run); {done} already done" in proc.stdout
            assert "conflict" not in proc.stderr and " 0 skipped" in proc.stdout
        assert_each_run_once(tmp_path, 3, db)


@pytest.mark.slow
def test_a_full_results_disk_before_the_sweep_then_space_again(tmp_path, torch_env):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        study(tmp_path / "matrix.toml", "full", extra=f'results = "{disk / "results"}"')
        filler = fill(disk)
        proc = matrun("sweep", cwd=tmp_path)
        no_traceback(proc.stderr)
        assert proc.returncode == 1
        first = planned_ids(tmp_path / "matrix.toml")[0]
        assert proc.stderr.splitlines()[-1] == (
            f"Error: no space left on device: {disk}/results/full/{first}/0-1/spec.json (every finished run is "
            "kept; free some space and run the sweep again)")
        assert list(disk.glob("results/full/*/*")) == []  # no half-made run directory stays
        filler.unlink()
        again = matrun("sweep", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "sweep full: 2 runs (2 ok); 0 already done" in again.stdout
        assert_each_run_once(tmp_path / "disk", 2, tmp_path / "matrun.duckdb")


@pytest.mark.slow
def test_a_results_disk_that_fills_during_a_cell_keeps_every_finished_run(tmp_path, torch_env):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        study(tmp_path / "matrix.toml", "full", seeds=(1, 2, 3), sizes=(64, 2000, 64),
              extra=f'results = "{disk / "results"}"')
        ids = planned_ids(tmp_path / "matrix.toml")
        sweep = start("sweep", cwd=tmp_path)
        try:  # the second cell has started (its monitor runs) when the disk fills up
            wait_for(lambda: (disk / "results/full" / ids[1] / "0-1/monitor.jsonl").exists()
                     and (disk / "results/full" / ids[1] / "0-1/monitor.jsonl").stat().st_size, 120,
                     "the second cell to start")
            filler = fill(disk)
        finally:
            rc, out, err = finish(sweep)
        no_traceback(err)
        assert rc == 1, out + err
        assert "sweep full: 1 runs (1 ok); 0 already done" in out
        assert err.splitlines()[-1] == (
            f"Error: no space left on device: {disk}/results/full/{ids[1]}/0-1/result.json (every finished run "
            "is kept; free some space and run the sweep again)")
        db = tmp_path / "matrun.duckdb"
        assert sql(db, "SELECT cell_id, attempt, status FROM runs") == [(ids[0], 1, "ok")]
        assert (disk / "results/full" / ids[0] / "0-1/result.json").exists()
        filler.unlink()
        again = matrun("sweep", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "sweep full: 2 runs (2 ok); 1 already done" in again.stdout
        assert sql(db, "SELECT cell_id, attempt, status FROM runs ORDER BY cell_id") == sorted(
            [(ids[0], 1, "ok"), (ids[1], 2, "ok"), (ids[2], 1, "ok")])
        # The attempt the full disk stopped stays on disk, unfinished, never ingested.
        assert not (disk / "results/full" / ids[1] / "0-1/result.json").exists()


def test_the_monitor_outlives_a_full_disk(tmp_path):
    """A results disk that fills while a cell runs: the sampling thread stops writing
    monitor.jsonl but keeps sampling, so the run still gets its aggregates (a real tmpfs)."""
    from matrun.runner.executors.monitor import Monitor

    with tmpfs(tmp_path / "disk", "64k") as disk:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
        try:
            (disk / "fill").write_bytes(b"x" * (60 * 1024))  # nearly full: the header fits, samples soon do not
            monitor = Monitor(child.pid, disk / "monitor.jsonl", interval_s=0.01)
            monitor.start()
            time.sleep(2.5)  # the disk fills within the first second (an 8 KiB buffer, flushed each second)
            totals = monitor.stop()
        finally:
            child.kill()
            child.wait()
    # Sampled all along (about 2.5 s at 100 Hz), though the file stopped taking them early.
    assert totals["samples"] > 150, totals
