"""No cell trains without a live sweep behind it (issue 25): the lease and the reaper, for real.

- The lease (runner/harness/lease.py): the watchdog kills the cell's process group when its
  lease reaches end-of-file, here with a pipe whose holder is killed with SIGKILL; the local
  executor's cell gets such a pipe, whose other end only the executor holds.  On the
  docker side (``docker.StdinLease``) the container's stdin, attached with ``StdinOnce``, is closed
  by the engine when its holder dies or lets go — shown with the base image and a shell.
- A container whose sweep process died stops itself: a real cell (the torch image) run by the
  docker executor in a process killed with SIGKILL exits by itself, "[matrun harness] … is gone"
  on its stderr; a live sweep's container is left alone by the reaper.
- The reaper (runner/executors/orphans.py), which every local or docker sweep runs before
  anything else: a running container of a dead owner (a sweep of an older matrun, without the
  lease) is stopped, its run recorded ``cancelled``, removed and named; one of a live owner,
  or without an owner label, is left alone.
- End to end: kill -9 of `matrun sweep --executor docker`'s process group mid-cell; the container
  stops itself within a bounded wait; the next sweep records the orphan and runs the cell again,
  after the orphan ended, once.

Other sweeps on the shared engine (CI's other tests) reap dead owners' containers too: the
record a reaper writes is the same whoever writes it, and the tests accept either reaper.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from matrun.runner.environments import engine
from matrun.runner.executors.docker import DockerExecutor, Owner, StdinLease
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.orphans import reap_containers, reap_orphans
from matrun.runner.executors.protocol import RunRequest
from matrun.runner.harness.lease import LEASE_LOST_EXIT, LEASE_LOST_MARK
from matrun.warehouse.bundles.layout import RESULT, STDERR, STDOUT
from matrun.warehouse.bundles.read import load_bundle

from test_docker_faults import (
    CELL, LONG, MATRUN, labelled, params, results, start_sweep, stop, torch_ready, wait_for, write_matrix, write_spec,
)
from test_sweep import sql

__all__ = ["torch_ready"]  # the fixture, shared with test_docker_faults

TEST_LABEL = "matrun.test"  # this module's own containers (removed by it, whatever happens)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts: only its exit status is left)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


# --- who owns a container ------------------------------------------------------------------

def test_the_owner_of_a_container_is_alive_only_while_that_very_process_runs():
    me = Owner.this_process()
    assert Owner.parse(me.label()) == me and me.alive() is True
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = Owner(me.host, me.boot, child.pid, me.start)
    assert dead.alive() is False  # the PID is gone
    assert Owner(me.host, me.boot, me.pid, str(int(me.start) + 1)).alive() is False  # the PID reused
    assert Owner(me.host, "another-boot", me.pid, me.start).alive() is False  # the host rebooted since
    assert Owner("another-host", me.boot, child.pid, me.start).alive() is None  # not this host's to judge
    for junk in (None, "", "pid 12", "{}", '{"host": "h", "boot": "b", "pid": "x", "start": "1"}', "[1]"):
        assert Owner.parse(junk) is None


def test_no_engine_means_nothing_to_reap_and_a_sweep_says_so_in_one_line(tmp_path):
    missing = f"unix://{tmp_path}/none.sock"
    assert reap_containers(DockerExecutor(docker_host=missing), log=print) == []
    write_matrix(tmp_path, "")
    proc = subprocess.run([*MATRUN, "sweep"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "DOCKER_HOST": missing})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"Error: no Docker engine: {tmp_path}/none.sock does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- the lease's watchdog, no engine -----------------------------------------------------------

_HOLDER = textwrap.dedent("""
    # The host's side: a pipe whose read end is the cell's stdin; the write end stays here.
    import os, subprocess, sys
    lease, held = os.pipe()
    cell = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=lease, stderr=open(sys.argv[2], "wb"),
                            start_new_session=True)
    os.close(lease)
    os.write(1, f"{cell.pid}\\n".encode())
    os.read(0, 1)  # until the test kills this process
""")
_CELL = textwrap.dedent("""
    # The cell: the watchdog on stdin, a child in its process group (as the oneDNN check would be).
    import subprocess, sys, time
    from matrun.runner.harness import lease
    lease.watch(0)
    child = subprocess.Popen(["sleep", "600"])
    print(child.pid, flush=True, file=sys.stderr)
    time.sleep(600)
""")


def test_the_watchdog_kills_the_cells_process_group_when_its_holder_is_killed(tmp_path, stage):
    err = tmp_path / "cell.stderr"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, _CELL, str(err)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(stage)})
    try:
        cell = int(holder.stdout.readline())
        child = int(wait_for(lambda: err.read_text().split("\n", 1)[0].strip(), "the cell's child", 60))
        assert not gone(cell) and not gone(child)  # the holder lives: so does the cell
        holder.kill()  # SIGKILL: the kernel closes the holder's end of the lease
        holder.wait()
        wait_for(lambda: gone(cell) and gone(child), "the end of the cell and of its child", 60)
    finally:
        holder.kill()
        holder.wait()
    assert LEASE_LOST_MARK in err.read_text()


def test_a_lease_never_held_stops_the_cell_at_once(tmp_path, stage):
    """stdin at end-of-file from the start (/dev/null): the lease is not held, nothing trains."""
    proc = subprocess.run([sys.executable, "-c", _CELL], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, start_new_session=True, env={**os.environ, "PYTHONPATH": str(stage)})
    assert proc.returncode == -signal.SIGKILL  # its own group's SIGKILL (not PID 1 of a container)
    assert LEASE_LOST_MARK in proc.stderr and "Traceback" not in proc.stderr


def harness_of(run_dir: Path) -> int | None:
    """The PID of the harness process running ``run_dir``'s cell, if one runs."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"matrun.runner.harness" in argv and str(run_dir / "spec.json").encode() in argv:
            return int(entry.name)
    return None


def pipe_of(fd_link: Path) -> str | None:
    try:
        target = os.readlink(fd_link)
    except OSError:
        return None
    return target if target.startswith("pipe:") else None


def test_a_local_cell_runs_with_its_lease_on_a_pipe_only_the_executor_holds(tmp_path, torch_env):
    run_dir = tmp_path / "bundle"
    write_spec(run_dir, params(**LONG), "local-lease")
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(LocalExecutor().run(RunRequest(
        run_dir=run_dir, params=params(**LONG), env_id="e", timeout=300, data_dir=Path("/nonexistent")))))
    thread.start()
    try:
        pid = wait_for(lambda: harness_of(run_dir), "the harness process", 60)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert argv[argv.index("--lease-fd") + 1] == "0"
        lease = pipe_of(Path(f"/proc/{pid}/fd/0"))
        assert lease is not None  # its stdin is a pipe ...
        held = [fd for fd in Path("/proc/self/fd").iterdir() if pipe_of(fd) == lease]
        assert len(held) == 1  # ... whose other end this process (the sweep) holds, once
        assert not [fd for fd in Path(f"/proc/{pid}/fd").iterdir() if fd.name != "0" and pipe_of(fd) == lease]
    finally:
        while thread.is_alive():  # the cell ends here: killed from outside, a failed run
            found = harness_of(run_dir)
            if found:
                os.kill(found, signal.SIGKILL)
            thread.join(0.5)
    assert outcome[0].status == "failed"
    assert not [fd for fd in Path("/proc/self/fd").iterdir() if pipe_of(fd) == lease]  # let go after the run


# --- the docker side of the lease: the base image and a shell ---------------------------------

@pytest.fixture(scope="module")
def base_image(docker_client):
    engine.ensure_base_image(docker_client)
    yield docker_client
    for container in docker_client.containers.list(all=True, filters={"label": TEST_LABEL}):
        if container.labels.get(TEST_LABEL, "").startswith(_RUN):
            container.remove(force=True)


_RUN = f"orphans-{uuid.uuid4().hex[:8]}"  # this session's TEST_LABEL values start so


def shell_cell(client, *, command: str, labels: dict[str, str] | None = None):
    """A container created as the executor creates a cell's (stdin open, so StdinOnce), no network."""
    return client.containers.create(engine.BASE_IMAGE, ["sh", "-c", command], stdin_open=True, network_mode="none",
                                    labels={TEST_LABEL: f"{_RUN}-{uuid.uuid4().hex[:6]}", **(labels or {})})


_DOCKER_HOLDER = textwrap.dedent("""
    import os, sys, docker
    from matrun.runner.executors.docker import StdinLease
    container = docker.from_env().containers.get(sys.argv[1])
    lease = StdinLease()
    lease.hold(container)
    container.start()
    os.write(1, b"started\\n")
    os.read(0, 1)  # until the test kills this process
""")
_READS_STDIN = "cat >/dev/null; echo 'lease ended'; exit 3"


def test_the_engine_closes_a_cells_stdin_when_the_lease_holder_dies_or_lets_go(base_image):
    client = base_image
    container = shell_cell(client, command=_READS_STDIN)
    assert (container.attrs["Config"]["OpenStdin"], container.attrs["Config"]["StdinOnce"]) == (True, True)
    holder = subprocess.Popen([sys.executable, "-c", _DOCKER_HOLDER, container.id], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"started\n"
        container.reload()
        assert container.status == "running"  # its holder lives
        holder.kill()
        holder.wait()
        wait_for(lambda: container.reload() or container.status == "exited", "the container's exit", 60)
    finally:
        holder.kill()
        holder.wait()
    assert container.attrs["State"]["ExitCode"] == 3 and container.logs() == b"lease ended\n"
    container.remove(force=True)

    # the executor's own end of a run: release() ends the attachment the same way
    container = shell_cell(client, command=_READS_STDIN)
    lease = StdinLease()
    lease.hold(container)
    container.start()
    lease.release()
    assert container.wait(timeout=60)["StatusCode"] == 3
    container.remove(force=True)


# --- the reaper: a running orphan without a lease, a live owner's container, a local sweep ------

def dead_owner() -> Owner:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    me = Owner.this_process()
    return Owner(me.host, me.boot, child.pid, me.start)


def orphan_labels(run_dir: Path, sweep: str, owner: Owner) -> dict[str, str]:
    return {"matrun.sweep": sweep, "matrun.cell": CELL, "matrun.run": "0-1", "matrun.role": "cell",
            "matrun.run_dir": str(run_dir), "matrun.owner": owner.label()}


def test_a_local_sweeps_reaper_stops_and_records_a_running_orphan_and_leaves_a_live_owners_alone(tmp_path, base_image):
    client = base_image
    dead, alive = f"dead-{uuid.uuid4().hex[:10]}", f"live-{uuid.uuid4().hex[:10]}"
    dead_dir, live_dir = tmp_path / dead / CELL / "0-1", tmp_path / alive / CELL / "0-1"
    write_spec(dead_dir, params(), dead)
    write_spec(live_dir, params(), alive)
    owner = dead_owner()
    # an orphan as an older matrun left it: no lease, training (sleeping) on
    orphan = shell_cell(client, command="echo training; sleep 600", labels=orphan_labels(dead_dir, dead, owner))
    orphan.start()
    mine = shell_cell(client, command="sleep 600", labels=orphan_labels(live_dir, alive, Owner.this_process()))
    mine.start()
    said: list[str] = []
    try:
        wait_for(lambda: orphan.reload() or "training" in orphan.logs().decode(), "the orphan's output", 60)
        recorded = reap_orphans(LocalExecutor(), log=said.append)  # a local sweep reaps the engine's orphans too
        assert labelled(client, dead) == []
        assert [c.status for c in labelled(client, alive)] == ["running"]  # its owner, this test, lives
    finally:
        mine.remove(force=True)
    record = json.loads((dead_dir / RESULT).read_text())
    assert record["status"] == "cancelled" and record["exit_code"] is None
    assert record["image"]["id"] == orphan.attrs["Image"]
    assert f"[matrun] container of a sweep that died (pid {owner.pid} on " in record["error_tail"]
    assert "it was still running: stopped and removed" in record["error_tail"]
    assert (dead_dir / STDOUT).read_text() == "training\n"
    if recorded:  # this reaper got there first (another sweep on the engine may have)
        # the engine may hold other dead sweeps' containers too (a run stopped by kill -9 before
        # this one, on this machine): the reaper records each of those in its own bundle; this
        # orphan's run is recorded once
        assert recorded.count(dead_dir) == 1
        assert [path for path in recorded if path.is_relative_to(tmp_path)] == [dead_dir]  # never the live one
        assert f"by the sweep of pid {os.getpid()} before it ran anything" in record["error_tail"]
        assert any(f"stopped container {orphan.short_id} (sweep {dead!r}, cell {CELL}, run 0-1) of a sweep "
                   f"that died (pid {owner.pid} on " in line and "it was still running; removed, its run "
                   f"recorded cancelled in {dead_dir}" in line for line in said), said
    assert not (live_dir / RESULT).exists()
    assert reap_orphans(LocalExecutor(), log=said.append) == []  # nothing left; nothing written twice


# --- a real cell: its executor killed, the container stops itself -----------------------------

_RUN_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from matrun.runner.executors.protocol import RunRequest
    from matrun.runner.executors.docker import DockerExecutor
    run_dir, p = Path(sys.argv[1]), json.loads(sys.argv[2])
    try:
        DockerExecutor().run(RunRequest(run_dir=run_dir, params=p, env_id="e", timeout=300,
                                        data_dir=Path("/nonexistent")))
    except KeyboardInterrupt:
        pass
""")


@pytest.mark.slow
def test_a_cell_whose_executor_is_killed_stops_itself_and_a_live_ones_trains_on(tmp_path, torch_ready):
    client = torch_ready
    live_sweep, dead_sweep = f"live-{uuid.uuid4().hex[:10]}", f"dead-{uuid.uuid4().hex[:10]}"
    live_dir, dead_dir = (tmp_path / live_sweep / CELL / "0-1", tmp_path / dead_sweep / CELL / "0-1")
    write_spec(live_dir, params(**LONG), live_sweep)
    write_spec(dead_dir, params(**LONG), dead_sweep)
    live = subprocess.Popen([sys.executable, "-c", _RUN_SCRIPT, str(live_dir), json.dumps(params(**LONG))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dead = subprocess.Popen([sys.executable, "-c", _RUN_SCRIPT, str(dead_dir), json.dumps(params(**LONG))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    try:
        (mine,) = wait_for(lambda: [c for c in labelled(client, live_sweep) if c.status == "running"],
                           "live container", 120, live)
        (orphan,) = wait_for(lambda: [c for c in labelled(client, dead_sweep) if c.status == "running"],
                             "container", 120, dead)
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        # stopped by its lease (or, had another sweep on the engine been quicker, reaped and recorded)
        wait_for(lambda: [c.status for c in labelled(client, dead_sweep)] in ([], ["exited"]),
                 "the orphan's end", 60)
        if labelled(client, dead_sweep):
            orphan.reload()
            assert orphan.attrs["State"]["ExitCode"] == LEASE_LOST_EXIT
            assert LEASE_LOST_MARK in orphan.logs(stdout=False).decode()
        recorded = reap_containers(DockerExecutor(client), log=said.append)
        assert [c.status for c in labelled(client, live_sweep)] == ["running"]  # its sweep runs, holding the lease
        assert labelled(client, dead_sweep) == []
    finally:
        if live.poll() is None:
            live.send_signal(signal.SIGINT)
        live.communicate(timeout=60)
        dead.kill()
    assert labelled(client, live_sweep) == []
    if recorded:  # and, as above, whatever other dead sweeps left on this engine
        assert [path for path in recorded if path.is_relative_to(tmp_path)] == [dead_dir]
        assert any(f"(pid {dead.pid} on " in line and "removed, its run recorded cancelled" in line
                   for line in said), said
    record = json.loads((dead_dir / RESULT).read_text())
    assert record["status"] == "cancelled" and record["exit_code"] == LEASE_LOST_EXIT
    assert f"[matrun] container of a sweep that died (pid {dead.pid} on " in record["error_tail"]
    assert (f"it had stopped itself (exit code {LEASE_LOST_EXIT}) when its sweep's lease ended"
            in record["error_tail"])
    assert LEASE_LOST_MARK in record["error_tail"]  # the cell's own words, from its stderr
    assert record["wall_seconds"] > 0 and record["started_at"] < record["ended_at"]
    events = dead_dir / "events.jsonl"  # none yet when it stopped while making its data
    assert not events.exists() or "summary" not in events.read_text()  # it never finished
    load_bundle(dead_dir)
    assert reap_containers(DockerExecutor(client), log=said.append) == []  # a recorded run is never written twice


# --- end to end: kill -9 of `matrun sweep --executor docker` ----------------------------------

@pytest.mark.slow
def test_kill_9_of_a_docker_sweep_the_container_stops_itself_and_the_next_sweep_records_it_first(tmp_path, torch_ready):
    client = torch_ready
    # seconds of training after PyTorch started: still training when it is killed 2 s in (and it
    # would finish within the wait below were its lease not to stop it); the next sweep runs it again
    name = write_matrix(tmp_path, "synthetic_train = 4096\nepochs = 4\n", drop=("synthetic_train", "epochs"))
    sweep = start_sweep(tmp_path)
    try:
        (container,) = wait_for(lambda: [c for c in labelled(client, name) if c.status == "running"],
                                "running container", 120, sweep)
        time.sleep(2.0)  # mid-cell
        os.killpg(sweep.pid, signal.SIGKILL)
        sweep.wait()
    finally:
        stop(sweep)
    labels = container.attrs["Labels"]  # from the engine's list (it may be gone by now)
    assert Owner.parse(labels["matrun.owner"]).pid == sweep.pid
    killed_dir = Path(labels["matrun.run_dir"])
    assert killed_dir.parent.parent == tmp_path / "results" / name and not (killed_dir / RESULT).exists()
    # nothing watches it now: it stops itself (another sweep on the engine may reap it first)
    wait_for(lambda: [c.status for c in labelled(client, name)] in ([], ["exited"]), "the orphan's end", 60)

    again = subprocess.Popen([*MATRUN, "sweep"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, out + err
    assert "Traceback" not in err
    assert labelled(client, name) == []
    runs = results(tmp_path, name)
    assert sorted((key.split("/")[1], r["status"]) for key, r in runs.items()) == [("0-1", "cancelled"), ("0-2", "ok")]
    orphan, rerun = runs[f"{killed_dir.parent.name}/0-1"], runs[f"{killed_dir.parent.name}/0-2"]
    assert f"[matrun] container of a sweep that died (pid {sweep.pid} on " in orphan["error_tail"]
    assert f"it had stopped itself (exit code {LEASE_LOST_EXIT}) when its sweep's lease ended" in orphan["error_tail"]
    # the re-run started after the orphan had ended: it never shared the machine with it
    assert orphan["ended_at"] < rerun["started_at"]
    reaped_here = f"by the sweep of pid {again.pid} " in orphan["error_tail"]
    assert reaped_here == (f"stopped container {container.short_id} (sweep {name!r}" in err), err
    assert orphan["executor"] == "docker" and orphan["image"]["id"] == container.attrs["ImageID"]
    assert (killed_dir / STDERR).exists() and (killed_dir / STDOUT).exists()
    assert {p.stat().st_uid for p in killed_dir.iterdir()} == {killed_dir.parent.stat().st_uid}
    load_bundle(killed_dir)  # a whole, valid bundle
    # recorded before the catch-up: in the warehouse with the run that replaced it, ok once
    rows = sql(tmp_path / "matrun.duckdb", "SELECT attempt, status, error_tail FROM runs ORDER BY attempt")
    assert [(a, s) for a, s, _ in rows] == [(1, "cancelled"), (2, "ok")]
    assert "container of a sweep that died" in rows[0][2]
    third = subprocess.run([*MATRUN, "sweep"], cwd=tmp_path, capture_output=True, text=True)
    assert "0 runs (nothing to run); 1 already done" in third.stdout, third.stdout + third.stderr
