"""Several hosts, one warehouse (docs/WAREHOUSE.md "Several hosts").

A throwaway PostgreSQL cluster (Debian's ``postgresql``: ``initdb`` and ``pg_ctl`` from
/usr/lib/postgresql/*/bin, run as ``nobody`` when the tests run as root) listens only on a
unix socket in its own directory; it is stopped by its recorded PID at the end.  Without
PostgreSQL these tests skip, except where MATRUN_REQUIRE_POSTGRES=1 (CI: .ci/run), where they
fail; ``make test`` installs it.  $MATRUN_POSTGRES_STATE (CI) is where the cluster lives, so a
cluster a killed session left can be stopped there (``make postgres-stop``).

Two "hosts" are two warehouse directories holding the same ``warehouse.toml``; two
``matrun ingest`` processes write at once, and a plain client reads through ``attach.sql``
meanwhile.  A local warehouse (SQLite catalog) has its writers take turns on its lock.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from bundle_factory import make_bundle
from conftest import missing
from lake_client import plain_connect, plain_writer
from matrun.errors import InputError, WarehouseError
from matrun.warehouse import catalog
from matrun.warehouse.db import forget_instances, migrations, open_warehouse
from matrun.warehouse.ingest import ingest

#: The schema version this matrun creates (its newest migration).
NEWEST = max(m.version for m in migrations())

MATRUN = str(Path(sys.executable).with_name("matrun"))
REQUIRE_POSTGRES = os.environ.get("MATRUN_REQUIRE_POSTGRES") == "1"
PORT = 5432  # names the socket file only: the cluster listens on no TCP address
ROLE = "matrun"
STEPS = 6  # a fabricated bundle's step records (bundle_factory's default step_seconds)


# -- a throwaway PostgreSQL cluster ------------------------------------------------------


@dataclass
class Cluster:
    """A running PostgreSQL cluster: its binaries, its directory (which holds the socket)
    and the postmaster's PID."""

    bin: Path
    home: Path
    pid: int

    def conninfo(self, dbname: str) -> str:
        return f"host={self.home} port={PORT} user={ROLE} dbname={dbname}"

    def createdb(self, name: str) -> str:
        """A new, empty database; returns the connection string naming it."""
        subprocess.run([str(self.bin / "createdb"), "-h", str(self.home), "-p", str(PORT), "-U", ROLE, name],
                       check=True, capture_output=True, timeout=60)
        return self.conninfo(name)

    def sql(self, dbname: str, statement: str) -> str:
        return subprocess.run([str(self.bin / "psql"), "-h", str(self.home), "-p", str(PORT), "-U", ROLE,
                               "-d", dbname, "-XAtc", statement],
                              check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def _postgres_bin() -> Path | None:
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")
             if (Path(p) / "initdb").is_file() and (Path(p) / "pg_ctl").is_file()]
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, default=None)


def _as_owner() -> dict:
    """subprocess arguments running a server program as ``nobody`` when we are root
    (PostgreSQL refuses to run as root), else as ourselves."""
    if os.geteuid() != 0:
        return {}
    return {"user": "nobody", "group": "nogroup", "extra_groups": []}


def _postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _is_our_postmaster(pid: int, data: Path) -> bool:
    """Whether ``pid`` is still the postmaster of the cluster in ``data`` (not a reused PID)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(args) and args[0].endswith(b"postgres") and str(data).encode() in args


def stop_cluster(pid: int | None, data: Path) -> None:
    """Stop the cluster's postmaster by its PID (fast shutdown), waiting until it is gone."""
    if pid is None or not _is_our_postmaster(pid, data):
        return
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while _is_our_postmaster(pid, data) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_our_postmaster(pid, data):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster():
    """A PostgreSQL cluster of our own, listening only on a unix socket in its directory."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        missing("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; Debian: apt-get "
                "install postgresql, as `make postgres` does)", required=REQUIRE_POSTGRES,
                variable="MATRUN_REQUIRE_POSTGRES")
    explicit = os.environ.get("MATRUN_POSTGRES_STATE")
    home = Path(explicit) if explicit else Path(tempfile.mkdtemp(prefix="matrun-pg-", dir="/tmp"))
    if explicit:  # what a killed session left there: stopped by its recorded PID, removed
        stop_cluster(_postmaster_pid(home / "data"), home / "data")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
    owner = _as_owner()
    if owner:
        shutil.chown(home, "nobody", "nogroup")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(home)}
    data = home / "data"
    pid = None
    try:
        for args in ([str(bin_dir / "initdb"), "-D", str(data), "-U", ROLE, "--auth=trust", "-E", "UTF8",
                      "--no-locale", "--no-sync"],
                     [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(home / "server.log"), "-w", "-t", "60",
                      "-o", f"-c listen_addresses='' -c unix_socket_directories='{home}' -c port={PORT} "
                            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off", "start"]):
            done = subprocess.run(args, cwd=home, env=env, capture_output=True, text=True, timeout=120, **owner)
            if done.returncode != 0:
                log = (home / "server.log").read_text(errors="replace") if (home / "server.log").exists() else ""
                raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout)[-600:]} {log[-600:]}")
        pid = _postmaster_pid(data)
        if pid is None:
            raise RuntimeError("the server started but wrote no postmaster.pid")
    except Exception as exc:
        stop_cluster(_postmaster_pid(data), data)
        shutil.rmtree(home, ignore_errors=True)
        missing(f"could not start a PostgreSQL test cluster: {exc}", required=REQUIRE_POSTGRES,
                variable="MATRUN_REQUIRE_POSTGRES")
    try:
        yield Cluster(bin_dir, home, pid)
    finally:
        stop_cluster(pid, data)
        shutil.rmtree(home, ignore_errors=True)


_NAMES = iter(range(10**6))


@pytest.fixture()
def lake_db(cluster: Cluster) -> str:
    """The connection string of a new, empty database of the cluster."""
    return cluster.createdb(f"lake{next(_NAMES)}_{os.getpid()}")


def make_host(path: Path, conninfo: str, data: Path) -> Path:
    """A host's warehouse directory on the shared catalog (``matrun warehouse init``'s work)."""
    lay, _ = catalog.create_shared(path, postgres=conninfo, data=data)
    with open_warehouse(lay.path):
        pass  # migrations and views
    forget_instances(lay.path)
    return lay.path


def make_bundles(results: Path, prefix: str, count: int) -> Path:
    """``count`` bundles of distinct runs (cell ids ``<prefix>…``) under ``results``."""
    for i in range(count):
        make_bundle(results, sweep=f"sweep-{prefix}", cell_id=f"{prefix}{i:014x}")
    return results


def matrun(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MATRUN, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600)


def start_matrun(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([MATRUN, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def counts(con: duckdb.DuckDBPyConnection) -> tuple[int, int, int]:
    """(runs, distinct run ids, steps), read in one query: one snapshot."""
    return con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(DISTINCT run_id) FROM runs), "
                       "(SELECT count(*) FROM steps)").fetchone()


_SUMMARY = re.compile(r"^ingested (\d+) run\(s\), (\d+) unchanged, (\d+) skipped, (\d+) incomplete$", re.M)


def summary(out: str) -> tuple[int, int, int, int]:
    match = _SUMMARY.search(out)
    assert match, out
    return tuple(int(n) for n in match.groups())  # type: ignore[return-value]


class Poller:
    """A plain client reading the warehouse through ``attach.sql`` every 20 ms in a thread,
    keeping every (runs, distinct run ids, steps) it saw."""

    def __init__(self, warehouse: Path) -> None:
        self.con = plain_connect(warehouse)
        self.seen: list[tuple[int, int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.seen.append(counts(self.con))
            except duckdb.Error as exc:
                self.errors.append(str(exc))
            time.sleep(0.02)

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.con.close()


# -- the test cluster itself -------------------------------------------------------------


def test_the_test_cluster_listens_only_on_its_unix_socket(cluster: Cluster) -> None:
    assert cluster.sql("postgres", "SHOW listen_addresses") == ""
    assert cluster.sql("postgres", "SHOW unix_socket_directories") == str(cluster.home)
    assert _is_our_postmaster(cluster.pid, cluster.home / "data")


# -- matrun warehouse init / info --------------------------------------------------------


def test_init_creates_a_shared_warehouse_and_info_describes_it(tmp_path: Path, lake_db: str) -> None:
    data = tmp_path / "shared" / "lake"
    proc = matrun("warehouse", "init", tmp_path / "host-a", "--postgres", lake_db, "--data", data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (f"warehouse {tmp_path / 'host-a'}: created a new lake in the catalog; "
                                           f"schema version {NEWEST}")
    assert sorted(os.listdir(tmp_path / "host-a")) == ["attach.sql", "warehouse.toml"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".host-a")]  # the scratch directory is gone
    lay = catalog.layout(tmp_path / "host-a")
    assert (lay.local, lay.catalog, lay.data) == (False, f"postgres:{lake_db}", data)
    assert data.is_dir()

    info = matrun("warehouse", "info", "--warehouse", tmp_path / "host-a")
    assert info.returncode == 0, info.stderr
    lines = dict(re.findall(r"^(\S+(?: files)?) +(.+)$", info.stdout, flags=re.M))
    assert lines["catalog"] == f"postgres: {lake_db}"
    assert lines["data"] == f"{data}/"
    assert lines["schema"] == f"version {NEWEST} (this matrun knows up to {NEWEST})"
    assert lines["runs"] == "0"
    assert lines["attach.sql"] == str(tmp_path / "host-a" / "attach.sql")
    assert f"  ATTACH 'ducklake:postgres:{lake_db}' AS lake (READ_ONLY, DATA_PATH '{data}/', " \
           "OVERRIDE_DATA_PATH true);" in info.stdout.splitlines()

    con = plain_connect(tmp_path / "host-a")  # a plain client reads it
    try:
        assert counts(con) == (0, 0, 0)
    finally:
        con.close()


def test_a_second_host_joins_the_lake_and_sees_the_first_host_s_runs(tmp_path: Path, lake_db: str) -> None:
    data = tmp_path / "shared"
    host_a = make_host(tmp_path / "a" / "matrun.duckdb", lake_db, data)
    report = ingest([make_bundles(tmp_path / "results-a", "a", 3)], warehouse=host_a)
    assert report.counts["ingested"] == 3
    proc = matrun("warehouse", "init", tmp_path / "b", "--postgres", lake_db, "--data", data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (f"warehouse {tmp_path / 'b'}: joined the lake already in the catalog "
                                           f"(3 run(s)); schema version {NEWEST}")
    report = ingest([make_bundles(tmp_path / "results-b", "b", 2)], warehouse=tmp_path / "b")
    assert report.counts["ingested"] == 2
    info = matrun("warehouse", "info", "--warehouse", host_a)
    assert re.search(r"^runs +5$", info.stdout, flags=re.M), info.stdout
    forget_instances()


@pytest.mark.parametrize("postgres, data, error", [
    ("host=db dbname", "/abs", 'Error: --postgres: missing "=" after "dbname" in the connection string '
                               "(the form is key=value key='a value')"),
    ("host='db dbname=x", "/abs", 'Error: --postgres: the quoted value of "host" is not terminated'),
    ("host=db dbname=x password=secret", "/abs",
     "Error: --postgres: the connection string holds a password; every host reads it from warehouse.toml and "
     "attach.sql: put the password in ~/.pgpass (or the file PGPASSFILE names) on each host instead, or use "
     "another authentication method"),
    ("postgresql://matrun:secret@db/lake", "/abs", "Error: --postgres: the connection string holds a password;"),
    ("", "/abs", "Error: --postgres: give a libpq connection string"),
    ("host=db dbname=x", "relative/lake", "Error: --data relative/lake: must be an absolute path, the same "
                                          "directory every host sees (a shared file system: NFS, Lustre, …)"),
])
def test_init_refuses_bad_input_and_writes_nothing(tmp_path: Path, postgres: str, data: str, error: str) -> None:
    proc = matrun("warehouse", "init", tmp_path / "w", "--postgres", postgres, "--data", data, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(error), proc.stderr
    assert "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []


def test_init_refuses_a_path_that_is_not_new_an_unknown_option_and_a_database_of_something_else(
        tmp_path: Path, cluster: Cluster, lake_db: str) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    proc = matrun("warehouse", "init", tmp_path / "used", "--postgres", lake_db, "--data", tmp_path / "d")
    assert (proc.returncode, proc.stderr.strip()) == (2, (
        f"Error: {tmp_path / 'used'}: already exists and is not an empty directory; give `matrun warehouse "
        "init` a new path (each host's warehouse directory holds only its warehouse.toml and attach.sql)"))
    proc = matrun("warehouse", "init", tmp_path / "w", "--postgres", f"{lake_db} colour=blue", "--data", tmp_path / "d")
    assert (proc.returncode, proc.stderr.strip()) == (
        2, f'Error: --postgres {lake_db} colour=blue: invalid connection option "colour"')
    dbname = lake_db.rsplit("=", 1)[1]
    cluster.sql(dbname, "CREATE TABLE invoices (id int)")
    proc = matrun("warehouse", "init", tmp_path / "w", "--postgres", lake_db, "--data", tmp_path / "d")
    assert (proc.returncode, proc.stderr.strip()) == (2, (
        f"Error: --postgres {lake_db}: the database holds other tables (public.invoices); give the warehouse a "
        "database of its own (createdb)"))
    assert not (tmp_path / "w").exists()


def test_init_says_so_when_the_server_cannot_be_reached(tmp_path: Path, cluster: Cluster) -> None:
    nowhere = f"host={tmp_path} port={PORT} user={ROLE} dbname=lake"  # no server has its socket there
    proc = matrun("warehouse", "init", tmp_path / "w", "--postgres", nowhere, "--data", tmp_path / "d")
    assert proc.returncode == 1
    assert proc.stderr.startswith(f'Error: cannot reach the PostgreSQL catalog {nowhere}: connection to server on '
                                  f'socket "{tmp_path}/.s.PGSQL.{PORT}" failed: No such file or directory'), proc.stderr
    assert proc.stderr.rstrip().endswith("(check that the server runs and that `psql` connects with this string)")
    missing_db = cluster.conninfo("no_such_database")
    proc = matrun("warehouse", "init", tmp_path / "w", "--postgres", missing_db, "--data", tmp_path / "d")
    assert proc.returncode == 1
    assert 'FATAL:  database "no_such_database" does not exist' in proc.stderr
    assert not (tmp_path / "w").exists()


def test_connection_strings_are_parsed_as_libpq_does_and_passwords_never_shown() -> None:
    assert catalog.conninfo_pairs(r"host=db  dbname = 'my lake' user=o\'brien options='-c x=\'1\''") == [
        ("host", "db"), ("dbname", "my lake"), ("user", "o'brien"), ("options", "-c x='1'")]
    assert catalog.conninfo_pairs("postgresql://me@db.example.org:5433/lake?sslmode=require") == [
        ("user", "me"), ("host", "db.example.org"), ("port", "5433"), ("dbname", "lake"), ("sslmode", "require")]
    assert catalog.shown_conninfo("host=db password='s e' dbname=x") == "host=db password=*** dbname=x"
    assert catalog.shown_conninfo("postgresql://me:pw@db/lake?password=pw2") == \
        "postgresql://me:***@db/lake?password=***"
    with pytest.raises(InputError, match="not a valid PostgreSQL URI"):
        catalog.conninfo_pairs("postgresql://db:port/lake")


# -- two writers at once -----------------------------------------------------------------


def test_two_ingests_at_once_into_a_local_warehouse_take_turns_and_both_land(tmp_path: Path) -> None:
    warehouse = tmp_path / "matrun.duckdb"  # created by whichever process gets there first
    a = make_bundles(tmp_path / "results-a", "a", 20)
    b = make_bundles(tmp_path / "results-b", "b", 20)
    procs = [start_matrun("ingest", a, "--warehouse", warehouse), start_matrun("ingest", b, "--warehouse", warehouse)]
    results = [finish(p) for p in procs]
    for code, out, err in results:
        assert code == 0, err
        assert summary(out) == (20, 0, 0, 0)
    assert catalog.layout(warehouse).local
    con = plain_connect(warehouse)
    try:
        assert counts(con) == (40, 40, 40 * STEPS)
    finally:
        con.close()


def test_two_hosts_ingest_at_once_while_a_plain_client_reads(tmp_path: Path, lake_db: str) -> None:
    data = tmp_path / "shared"
    host_a = make_host(tmp_path / "host-a", lake_db, data)
    host_b = make_host(tmp_path / "host-b", lake_db, data)
    a = make_bundles(tmp_path / "results-a", "a", 30)
    b = make_bundles(tmp_path / "results-b", "b", 30)
    with Poller(host_a) as poller:
        procs = [start_matrun("ingest", a, "--warehouse", host_a), start_matrun("ingest", b, "--warehouse", host_b)]
        results = [finish(p) for p in procs]
        time.sleep(0.1)  # one more poll after both are done
    for code, out, err in results:
        assert code == 0, err
        assert summary(out) == (30, 0, 0, 0)
    assert not poller.errors
    assert poller.seen and poller.seen[-1] == (60, 60, 60 * STEPS)
    for runs, distinct, steps in poller.seen:  # every ingest whole or not at all
        assert runs in (0, 30, 60) and distinct == runs and steps == runs * STEPS
    assert poller.seen == sorted(poller.seen)


def test_the_same_bundles_from_two_hosts_at_once_land_once(tmp_path: Path, lake_db: str) -> None:
    data = tmp_path / "shared"
    hosts = [make_host(tmp_path / "host-a", lake_db, data), make_host(tmp_path / "host-b", lake_db, data)]
    results_dir = make_bundles(tmp_path / "results", "c", 25)
    with Poller(hosts[0]) as poller:
        procs = [start_matrun("ingest", results_dir, "--warehouse", host) for host in hosts]
        results = [finish(p) for p in procs]
    reports = []
    for code, out, err in results:
        assert code == 0, err
        reports.append(summary(out))
    # each bundle written by exactly one of them; the other found it there
    assert sorted(reports) == [(0, 25, 0, 0), (25, 0, 0, 0)]
    assert not poller.errors
    for runs, distinct, steps in poller.seen:
        assert runs in (0, 25) and distinct == runs and steps == runs * STEPS
    con = plain_connect(hosts[1])
    try:
        assert counts(con) == (25, 25, 25 * STEPS)
    finally:
        con.close()


def _commit_from_another_host_first(monkeypatch: pytest.MonkeyPatch, other: list[object]) -> list[int]:
    """Make this process's next ingest transaction lose: at its first claim of the writer
    epoch (its selection made, in its snapshot) another process (``matrun ingest *other``)
    ingests to the end.  Returns the list that counts this process's claims."""
    claims: list[int] = []
    real = catalog.claim_writer

    def claim(con: duckdb.DuckDBPyConnection) -> None:
        claims.append(1)
        if len(claims) == 1:
            proc = matrun("ingest", *other)
            assert proc.returncode == 0, proc.stderr
        real(con)

    monkeypatch.setattr(catalog, "claim_writer", claim)
    return claims


def test_a_transaction_another_host_overtook_is_done_again_and_the_runs_land_once(
        tmp_path: Path, lake_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "shared"
    host_a = make_host(tmp_path / "host-a", lake_db, data)
    host_b = make_host(tmp_path / "host-b", lake_db, data)
    same = make_bundles(tmp_path / "results", "d", 4)
    claims = _commit_from_another_host_first(monkeypatch, [same, "--warehouse", host_b])
    report = ingest([same], warehouse=host_a)
    # host b wrote them while host a's transaction ran: a's commit conflicted, and its second
    # attempt found them there
    assert len(claims) == 1 and report.counts == {"ingested": 0, "unchanged": 4, "skipped": 0, "incomplete": 0}
    with open_warehouse(host_a, read_only=True) as wh:
        assert counts(wh.con) == (4, 4, 4 * STEPS)
    forget_instances()


def test_a_transaction_another_host_overtook_with_other_runs_lands_on_its_second_attempt(
        tmp_path: Path, lake_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "shared"
    host_a = make_host(tmp_path / "host-a", lake_db, data)
    host_b = make_host(tmp_path / "host-b", lake_db, data)
    mine = make_bundles(tmp_path / "results-a", "e", 4)
    theirs = make_bundles(tmp_path / "results-b", "f", 3)
    claims = _commit_from_another_host_first(monkeypatch, [theirs, "--warehouse", host_b])
    report = ingest([mine], warehouse=host_a)
    assert len(claims) == 2  # the first attempt conflicted with host b's commit
    assert report.counts == {"ingested": 4, "unchanged": 0, "skipped": 0, "incomplete": 0}
    with open_warehouse(host_a, read_only=True) as wh:
        assert counts(wh.con) == (7, 7, 7 * STEPS)
    forget_instances()


def test_what_a_ducklake_conflict_looks_like(tmp_path: Path, lake_db: str) -> None:
    host = make_host(tmp_path / "host", lake_db, tmp_path / "shared")
    first, second = plain_writer(host), plain_writer(host)
    try:
        for con in (first, second):
            con.execute("BEGIN TRANSACTION")
            catalog.claim_writer(con)
        first.execute("COMMIT")
        with pytest.raises(duckdb.TransactionException) as caught:
            second.execute("COMMIT")
    finally:
        first.close()
        second.close()
    message = str(caught.value)
    assert message.startswith("TransactionContext Error: Failed to commit: Failed to commit DuckLake transaction.")
    assert "Transaction conflict" in message
    assert catalog.is_conflict(caught.value)
    assert not catalog.is_conflict(duckdb.TransactionException("TransactionContext Error: cannot rollback"))


def test_conflicts_are_retried_with_growing_pauses_then_give_a_clear_error() -> None:
    pauses: list[float] = []
    attempts: list[int] = []

    def lose() -> None:
        attempts.append(1)
        raise catalog.WriterConflict("Transaction conflict - attempting to insert into table …")

    with pytest.raises(WarehouseError) as caught:
        catalog.retry_conflicts(Path("/w"), lose, attempts=6, sleep=pauses.append)
    assert len(attempts) == 6 and len(pauses) == 5
    first, longest = catalog.CONFLICT_PAUSE_S
    for n, pause in enumerate(pauses):
        bound = min(first * 2 ** n, longest)
        assert bound / 2 <= pause <= bound
    assert str(caught.value) == (
        "warehouse /w: 6 attempts to write conflicted with other writers of its catalog (the last: "
        "Transaction conflict - attempting to insert into table …); this batch was not written: run the "
        "command again")
    tries = iter([catalog.WriterConflict("x"), catalog.WriterConflict("x")])

    def win_third() -> str:
        error = next(tries, None)
        if error:
            raise error
        return "done"

    assert catalog.retry_conflicts(Path("/w"), win_third, sleep=pauses.append) == "done"


# -- info and compact on a local warehouse -----------------------------------------------


def data_files(info: str) -> dict[str, int]:
    """{table: files} from the "data files" line of `matrun warehouse info`."""
    line = re.search(r"^data files +(\d+)(?: \((.*)\))?$", info, re.M)
    assert line, info
    tables = {name: int(n) for name, n in (part.rsplit(" ", 1) for part in (line.group(2) or "").split(", ") if part)}
    assert sum(tables.values()) == int(line.group(1)), info
    return tables


def test_info_and_compact_on_a_local_warehouse(tmp_path: Path) -> None:
    warehouse = tmp_path / "matrun.duckdb"
    for i in range(3):  # three transactions: three files in steps
        assert ingest([make_bundles(tmp_path / f"results-{i}", f"{i}", 4)], warehouse=warehouse).clean
    info = matrun("warehouse", "info", "--warehouse", warehouse)
    assert info.returncode == 0, info.stderr
    assert re.search(rf"^catalog +sqlite: {re.escape(str(warehouse / 'catalog.sqlite'))}$", info.stdout, re.M)
    assert re.search(r"^writers +one host; its writers take turns on \.writer\.lock \(flock\)$", info.stdout, re.M)
    assert re.search(r"^runs +12$", info.stdout, re.M)
    # the small tables' rows are inlined in the catalog; steps has one file per ingest (and the
    # views' caches one where an ingest wrote more than a few rows to one)
    before = data_files(info.stdout)
    assert before.pop("steps") == 3 and all(name.startswith("view_cache_") for name in before), info.stdout
    proc = matrun("warehouse", "compact", "--warehouse", warehouse)
    assert proc.returncode == 0, proc.stderr
    assert re.match(rf"data files: {3 + sum(before.values())} before, \d+ after; \d+ file\(s\) that no snapshot "
                    r"of the last 1 hour needs deleted$", proc.stdout.strip()), proc.stdout
    info = matrun("warehouse", "info", "--warehouse", warehouse)  # inlined rows written out, steps merged
    after = data_files(info.stdout)
    assert {name: after.get(name) for name in ("epochs", "monitor_samples", "runs", "schema_migrations", "steps")} \
        == dict.fromkeys(("epochs", "monitor_samples", "runs", "schema_migrations", "steps"), 1), info.stdout
    con = plain_connect(warehouse)
    try:
        assert counts(con) == (12, 12, 12 * STEPS)
    finally:
        con.close()
    missing_one = matrun("warehouse", "info", "--warehouse", tmp_path / "nothing-here")
    assert missing_one.returncode == 2 and missing_one.stderr.startswith(  # bad input: nothing is there
        f"Error: warehouse {tmp_path / 'nothing-here'} does not exist")
