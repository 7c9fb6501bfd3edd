"""The warehouse under faults, for real: a full disk (a small tmpfs), a creation cut short
(by a full disk or by kill -9), an ingest killed mid-transaction, the 0-byte file an older
matrun left, two processes creating or recovering one warehouse at once.  Every case ends
with an ``Error:`` line or a working warehouse, never a traceback, never a half-written
warehouse, and the bundles untouched.

Mounting a tmpfs needs root (the tests skip without it); each is unmounted by the fixture.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import duckdb
import pytest

from bundle_factory import make_bundle
from matrun.errors import WarehouseError
from matrun.warehouse.db import DUCKDB_HEADER_BYTES, open_warehouse, unfinished
from matrun.warehouse.ingest import ingest

MATRUN = [sys.executable, "-m", "matrun.runner.cli.main"]
TABLES = ("runs", "steps", "epochs", "monitor_samples")
NO_SPACE_INGEST = ("nothing was written to it and the bundles are kept: free some space and run "
                   "`matrun ingest` again")


def matrun(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MATRUN, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def counts(path: Path) -> dict[str, int]:
    with open_warehouse(path, read_only=True) as wh:
        return {t: wh.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def steps_per_run(path: Path) -> list[tuple[str, int]]:
    with open_warehouse(path, read_only=True) as wh:
        return wh.con.execute("SELECT run_id, count(*) FROM steps GROUP BY run_id ORDER BY run_id").fetchall()


def tree_digest(root: Path) -> str:
    """SHA-256 over every file under ``root``, names and bytes: the bundles as they are."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``small_disk("8m")`` mounts a fresh tmpfs of that size and returns its directory."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs (a real full disk) needs root")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
        mounted.append(disk)
        return disk

    yield mount
    for disk in reversed(mounted):
        if subprocess.run(["umount", str(disk)], check=False).returncode:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` with a file of zeros until only ``leave`` bytes are free; return the file
    (delete it to free the space)."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    with open(filler, "ab") as fh:
        try:
            fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
        except OSError:
            pass
    return filler


# -- a full disk during ingest -------------------------------------------------------------


def _fill_results(results: Path, n: int) -> list[Path]:
    # Step times that do not compress: the Parquet files must not fit in what the disk has left.
    return [make_bundle(results, cell_id=f"{cell:016x}", warmup_steps=10,
                        step_seconds=[0.01 + ((i * 7919 + cell * 104729) % 100003) * 1e-9
                                      for i in range(4000)])
            for cell in range(1, n + 1)]


def test_ingest_on_a_full_disk_writes_nothing_keeps_the_bundles_and_recovers(
        tmp_path: Path, small_disk: Callable[[str], Path]) -> None:
    disk = small_disk("16m")
    wh = disk / "w.duckdb"
    first = tmp_path / "first"
    make_bundle(first)
    assert matrun("ingest", first, "--warehouse", wh, cwd=tmp_path).returncode == 0
    before = counts(wh)
    results = tmp_path / "results"
    _fill_results(results, 30)
    bundles_before = tree_digest(results)
    filler = fill(disk, leave=512 * 1024)

    full = matrun("ingest", results, "--warehouse", wh, cwd=tmp_path)
    assert (full.returncode, full.stdout) == (1, "")
    assert full.stderr == f"Error: no space left on device: {wh}; {NO_SPACE_INGEST}\n"
    assert counts(wh) == before == {"runs": 1, "steps": 6, "epochs": 2, "monitor_samples": 2}
    assert tree_digest(results) == bundles_before

    filler.unlink()
    again = matrun("ingest", results, first, "--warehouse", wh, cwd=tmp_path)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == "ingested 30 run(s), 1 unchanged, 0 skipped, 0 incomplete\n"
    assert counts(wh) == {"runs": 31, "steps": 120_006, "epochs": 62, "monitor_samples": 62}
    assert [n for _, n in steps_per_run(wh)] == [4000] * 30 + [6]
    assert tree_digest(results) == bundles_before


def test_the_library_raises_the_same_error_and_the_same_process_recovers(
        tmp_path: Path, small_disk: Callable[[str], Path]) -> None:
    disk = small_disk("16m")
    wh = disk / "w.duckdb"
    results = tmp_path / "results"
    _fill_results(results, 30)
    with open_warehouse(wh):
        pass
    filler = fill(disk, leave=256 * 1024)
    with pytest.raises(WarehouseError) as err:
        ingest([results], warehouse=wh)
    assert str(err.value) == f"no space left on device: {wh}; {NO_SPACE_INGEST}"
    assert counts(wh) == {"runs": 0, "steps": 0, "epochs": 0, "monitor_samples": 0}
    filler.unlink()
    report = ingest([results], warehouse=wh)
    assert report.counts == {"ingested": 30, "unchanged": 0, "skipped": 0, "incomplete": 0}
    assert counts(wh)["steps"] == 120_000


# -- a creation cut short ------------------------------------------------------------------


@pytest.mark.parametrize("leave", [0, 4096, 8192, 65536])
def test_first_open_on_a_full_disk_leaves_nothing_and_the_next_creates_it(
        tmp_path: Path, small_disk: Callable[[str], Path], leave: int) -> None:
    disk = small_disk("4m")
    wh = disk / "sub" / "w.duckdb"
    (disk / "sub").mkdir()
    make_bundle(tmp_path / "results")
    filler = fill(disk, leave=leave)

    full = matrun("ingest", tmp_path / "results", "--warehouse", wh, cwd=tmp_path)
    assert (full.returncode, full.stdout) == (1, "")
    assert full.stderr.startswith(f"Error: no space left on device: {wh}; ")
    assert "Traceback" not in full.stderr
    assert os.listdir(disk / "sub") == []  # no 0-byte warehouse, no scratch file, no log

    filler.unlink()
    done = matrun("ingest", tmp_path / "results", "--warehouse", wh, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "ingested 1 run(s), 0 unchanged, 0 skipped, 0 incomplete\n")
    assert os.listdir(disk / "sub") == ["w.duckdb"]
    assert counts(wh)["runs"] == 1


@pytest.mark.parametrize(("leave", "first_command"), [
    (0, "query"), (0, "ingest"), (4096, "query"), (8192, "ingest"),
])
def test_the_file_an_older_matrun_left_on_a_full_disk_is_recreated(
        tmp_path: Path, small_disk: Callable[[str], Path], leave: int, first_command: str) -> None:
    disk = small_disk("4m")
    wh = disk / "w.duckdb"
    filler = fill(disk, leave=leave)
    with pytest.raises(duckdb.IOException, match="No space left on device"):
        duckdb.connect(str(wh))  # what the open of an older matrun did: it leaves a stub
    assert wh.stat().st_size == leave < DUCKDB_HEADER_BYTES and unfinished(wh)
    filler.unlink()

    make_bundle(tmp_path / "results")
    if first_command == "query":  # a reader leaves it as it is, and says what replaces it
        res = matrun("query", "SELECT count(*) AS n FROM runs", "--format", "csv", "--warehouse", wh,
                     cwd=tmp_path)
        assert (res.returncode, res.stdout) == (1, "")
        assert res.stderr == (f"Error: warehouse {wh} is an empty file an older matrun's creation cut short "
                              "(it holds no runs); a command that writes replaces it with a new warehouse: "
                              f"matrun warehouse upgrade --warehouse {wh}, or an ingest or sweep into it\n")
        assert wh.stat().st_size == leave and sorted(os.listdir(disk)) == ["w.duckdb"]
    res = matrun("ingest", tmp_path / "results", "--warehouse", wh, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert counts(wh)["runs"] == 1
    assert sorted(os.listdir(disk)) == ["w.duckdb"]


def test_a_creation_killed_midway_leaves_no_warehouse_and_the_next_open_cleans_up(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "import matrun.warehouse.db as db\n"
        "real = db.catalog.write_attach_sql\n"
        "def slow(layout):\n"
        "    real(layout)\n"
        "    print('built', flush=True)\n"
        "    time.sleep(600)\n"
        "db.catalog.write_attach_sql = slow\n"
        "with db.open_warehouse(sys.argv[1]):\n"
        "    pass\n"), str(wh)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "built\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    left = sorted(os.listdir(tmp_path))
    assert not wh.exists() and left and all(name.startswith(".w.duckdb.creating-") for name in left)

    make_bundle(tmp_path / "results")
    res = matrun("ingest", tmp_path / "results", "--warehouse", wh, cwd=tmp_path)
    assert (res.returncode, res.stderr) == (0, "")
    assert sorted(os.listdir(tmp_path)) == ["results", "w.duckdb"]
    assert counts(wh)["runs"] == 1


# -- never a file with data ----------------------------------------------------------------


def test_an_empty_file_with_a_log_beside_it_is_never_replaced(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    wal, log = tmp_path / "w.duckdb.wal", b"committed work, perhaps" * 10
    wh.write_bytes(b"")
    wal.write_bytes(log)
    assert not unfinished(wh)
    with pytest.raises(WarehouseError) as err:
        with open_warehouse(wh):
            pass
    assert str(err.value) == (f"{wh} is not a DuckDB database file; point --warehouse at a "
                              "matrun warehouse or at a new name")
    assert wh.read_bytes() == b"" and wal.read_bytes() == log


@pytest.mark.parametrize("content", [b"x", b"my notes\n" * 100, b"\0" * 8 + b"DUCX" + b"\0" * 4084])
def test_a_short_file_that_is_not_a_duckdb_header_is_never_replaced(tmp_path: Path, content: bytes) -> None:
    wh = tmp_path / "w.duckdb"
    wh.write_bytes(content)
    assert not unfinished(wh)
    with pytest.raises(WarehouseError):
        with open_warehouse(wh):
            pass
    assert wh.read_bytes() == content


def test_a_real_warehouse_is_never_taken_for_an_unfinished_one(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    make_bundle(tmp_path / "results")
    ingest([tmp_path / "results"], warehouse=wh)
    assert not unfinished(wh)
    empty = tmp_path / "plain.duckdb"
    duckdb.connect(str(empty)).close()  # DuckDB's smallest file: its three headers
    assert empty.stat().st_size == DUCKDB_HEADER_BYTES and not unfinished(empty)


# -- two processes at once -----------------------------------------------------------------


@pytest.mark.parametrize("start", ["missing", "empty file"])
def test_two_processes_creating_one_warehouse_at_once(tmp_path: Path, start: str) -> None:
    wh = tmp_path / "w.duckdb"
    if start == "empty file":
        wh.write_bytes(b"")
    for n in (1, 2):
        make_bundle(tmp_path / f"results{n}", cell_id=f"{n:016x}")
    procs = [subprocess.Popen([*MATRUN, "ingest", str(tmp_path / f"results{n}"), "--warehouse", str(wh),
                               "--wait", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path) for n in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o for o, _ in outs] == ["ingested 1 run(s), 0 unchanged, 0 skipped, 0 incomplete\n"] * 2
    assert counts(wh)["runs"] == 2
    assert sorted(os.listdir(tmp_path)) == ["results1", "results2", "w.duckdb"]


def test_only_scratch_files_of_dead_processes_on_this_host_are_removed(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    dead = tmp_path / f".w.duckdb.creating-{host}-{gone.pid}-0a0a0a0a"
    alive = tmp_path / f".w.duckdb.creating-{host}-{os.getpid()}-0b0b0b0b"
    elsewhere = tmp_path / f".w.duckdb.creating-some-other-host-{gone.pid}-0c0c0c0c"
    other_file = tmp_path / f".x.duckdb.creating-{host}-{gone.pid}-0d0d0d0d"
    for scratch in (dead, alive, elsewhere, other_file):
        scratch.write_bytes(b"")
    Path(f"{dead}.wal").write_bytes(b"log")
    with open_warehouse(wh):
        pass
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, elsewhere.name, other_file.name, "w.duckdb"])


def test_an_unfinished_file_on_a_read_only_disk_is_reported_not_replaced(
        tmp_path: Path, small_disk: Callable[[str], Path]) -> None:
    disk = small_disk("1m")
    wh = disk / "w.duckdb"
    wh.write_bytes(b"")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    res = matrun("warehouse", "upgrade", "--warehouse", wh, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"Error: warehouse {wh} is empty (its creation was cut short) and cannot be "
                          "recreated here: Read-only file system\n")
    assert wh.read_bytes() == b""


# -- kill -9 in the middle of an ingest's transaction ------------------------------------------


def test_an_ingest_killed_mid_transaction_leaves_the_warehouse_as_it_was(tmp_path: Path) -> None:
    wh, results = tmp_path / "w.duckdb", tmp_path / "results"
    make_bundle(tmp_path / "first")
    ingest([tmp_path / "first"], warehouse=wh)
    for cell in range(1, 21):
        make_bundle(results, cell_id=f"{cell:016x}", step_seconds=[0.01] * 500, warmup_steps=10)
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "import matrun.warehouse.ingest as ingest\n"
        "real = ingest._insert_table\n"
        "def slow(con, name, table):\n"
        "    real(con, name, table)\n"
        "    if name == 'steps':\n"
        "        print('steps inserted', flush=True)\n"
        "        time.sleep(600)\n"
        "ingest._insert_table = slow\n"
        "ingest.ingest([sys.argv[1]], warehouse=sys.argv[2])\n"), str(results), str(wh)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "steps inserted\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert counts(wh) == {"runs": 1, "steps": 6, "epochs": 2, "monitor_samples": 2}
    res = matrun("ingest", results, tmp_path / "first", "--warehouse", wh, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (0, "ingested 20 run(s), 1 unchanged, 0 skipped, 0 incomplete\n")
    assert counts(wh) == {"runs": 21, "steps": 10_006, "epochs": 42, "monitor_samples": 42}
