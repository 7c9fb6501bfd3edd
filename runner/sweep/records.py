"""What both sweep loops share: a run's directory and records, ingesting, the locks, the events.

The synchronous loop (``runner/sweep/run.py``) and the asynchronous one
(``runner/slurm/loop.py``) each prepare a run's new attempt directory with its ``spec.json``
(``prepare_run``), have its ``result.json`` written last and atomically (``write_result``: by the
sweep, by a Slurm task, or for a run Slurm ended), ingest what finished without failing the
sweep when the warehouse cannot take it (``ingest_quietly``), hold the sweep's lock
(``sweep_lock``) and report to the caller through ``SweepEvent`` and ``SweepSummary``.

Sweeps that share a results directory share its runs (docs/BUNDLE.md, "Runs shared by
sweeps"): attempts are numbered per results directory, under its ``.attempts.lock``
(``prepare_run``), so a run id never names two runs; a synchronous sweep runs a (cell, repeat)
only while it holds that pair's claim (``RunClaim``, ``<results>/.claims/``) and, once it holds
it, first looks for an ok run another sweep made meanwhile (``ok_runs_on_disk``).  An
``OSError`` of the sweep's own files becomes ``path_error``'s ``Error:`` naming the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

import matrun
from matrun.errors import InputError, MatrunError, SweepLocked
from matrun.runner.environments.venvs import release_record
from matrun.runner.executors.gpu import host_gpu_facts
from matrun.runner.executors.protocol import RunOutcome
from matrun.runner.harness.cpusets import parse_cpuset
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.planning.matrix import Matrix
from matrun.runner.sweep.machine import LoadWatch, machine_state
from matrun.warehouse.bundles.layout import RESULT, SCHEMA_VERSION, SPEC, RunKey, parse_run_dir_name
from matrun.warehouse.bundles.write import next_attempt, write_json_atomic
from matrun.warehouse.bundles.read import loads

INGEST_WAIT_S = 60.0  # how long an ingest waits for the warehouse's lock
#: Under the results directory: one claim file per (cell, repeat) (``RunClaim``).  Sweep names
#: never start with a dot (runner/planning/matrix.py), so these never clash with a sweep.
CLAIMS_DIR = ".claims"
#: Under the results directory: held while a run's attempt number is chosen (``prepare_run``).
ATTEMPTS_LOCK = ".attempts.lock"
#: A path longer than this is shortened in messages (its start, its end and its length).
MESSAGE_PATH_CHARS = 240


@dataclass
class SweepEvent:
    # "message" | "plan" | "run-start" | "run-end" | "run-skip" (done by another sweep meanwhile) |
    # "run-again" (the run that just ended started busy: one more run of its repeat, runner/sweep/busy.py) |
    # "adaptive" (a round of adaptive repeats: ``total`` more runs, their cells in ``expected``'s keys)
    kind: str
    text: str = ""
    total: int = 0
    estimate_s: float | None = None
    # plan: cell id -> the seconds a run of it should take ({} when no cell ran before; None
    # when runs go in parallel), for the progress line's estimate (runner/sweep/progress.py)
    expected: dict[str, float] | None = None
    cell: PlannedCell | None = None
    repeat: int = 0
    outcome: RunOutcome | None = None


@dataclass
class SweepSummary:
    sweep: str
    executor: str
    planned: int = 0
    skipped_done: int = 0
    ran: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    done_elsewhere: int = 0  # (cell, repeat)s another sweep of the results directory ran (in skipped_done)
    # What the sweep's ingests did (catch-up included): bundles put into the warehouse, found
    # there already, and skipped ("path: reason": refused, or not ingested at all).
    ingested: int = 0
    unchanged: int = 0
    skipped: list[str] = field(default_factory=list)
    skipped_paths: list[Path] = field(default_factory=list)  # the bundles of ``skipped``
    # asynchronous executors (slurm)
    submitted: int = 0
    job_ids: list[str] = field(default_factory=list)
    in_flight: int = 0  # runs queued or running from earlier submissions when this sweep started
    detached: bool = False
    warnings: list[str] = field(default_factory=list)
    busy_reruns: int = 0  # runs made again because the run before started busy ([sweep] rerun_busy)
    # adaptive repeats ([sweep] repeats = { min, max }): rounds and runs added beyond min, and
    # the verdicts still undecided when the sweep stopped adding (max or max_time reached)
    adaptive_rounds: int = 0
    adaptive_runs: int = 0
    undecided: int = 0
    # cells left out by --skip-unrunnable: "cell <id> (<label>): <reason>"
    unrunnable: list[str] = field(default_factory=list)

    def count(self, status: str) -> None:
        """One more run that ended with ``status``."""
        self.ran += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1

    def add_ingest(self, report: Any) -> None:
        """Count what one ``warehouse.ingest`` did (its ``IngestReport``)."""
        self.ingested += len(report.ingested)
        self.unchanged += len(report.unchanged)
        self.skipped.extend(f"{path}: {reason}" for path, reason in report.skipped)
        self.skipped_paths.extend(Path(path) for path, _ in report.skipped)

    @property
    def failed(self) -> bool:
        """Whether a run of this sweep ended other than ok."""
        return self.by_status.get("ok", 0) < self.ran


class SweepStopped(MatrunError):
    """The sweep stopped before its end (a full disk, a path it cannot write, a warehouse
    error): the message says why; ``summary`` is what it did until then (every run it
    finished is on disk, and in the warehouse unless ``summary.skipped`` says otherwise)."""

    def __init__(self, cause: MatrunError, summary: SweepSummary) -> None:
        super().__init__(str(cause))
        self.exit_code = cause.exit_code
        self.summary = summary


def short_path(path: Path | str) -> str:
    """``path`` for a message: whole, or its start and end with its length when it is long."""
    text = str(path)
    if len(text) <= MESSAGE_PATH_CHARS:
        return text
    return f"{text[:MESSAGE_PATH_CHARS // 2]}…{text[-MESSAGE_PATH_CHARS // 4:]} ({len(text)} characters)"


def path_error(exc: OSError, path: Path | str | None = None) -> MatrunError:
    """An ``OSError`` of one of the sweep's files as the error a user reads: what the system
    said and the path, e.g. ``no space left on device: /results/demo/…/0-1/result.json``.
    A name too long for the file system is bad input (exit 2); anything else a failure (1)."""
    where = exc.filename if exc.filename is not None else path
    text = (exc.strerror or str(exc) or type(exc).__name__).rstrip(".")
    text = text[:1].lower() + text[1:]
    message = f"{text}: {short_path(where)}" if where is not None else text
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        message += " (every finished run is kept; free some space and run the sweep again)"
    return InputError(message) if exc.errno == errno.ENAMETOOLONG else MatrunError(message)


def prepare_run(matrix: Matrix, pc: PlannedCell, repeat: int, earlier_attempt: int,
                data_dir: Path, *, canary: int | None = None) -> tuple[RunKey, Path]:
    """The run's new attempt directory with its spec.json (``canary``: a canary run's number
    within its sweep, written as spec.json ``canary``; runner/sweep/canary.py).

    Attempts are numbered per results directory: one more than the highest attempt of the
    (cell, repeat) in any sweep's folder there (``next_attempt``) and than ``earlier_attempt``,
    the highest the warehouse knows of (a run made under another results directory).  The
    number is chosen and the directory made under the results directory's ``.attempts.lock``,
    so two sweeps can never make the same run id.  An ``OSError`` (a full disk) is raised, and
    the directory removed again when spec.json could not be written.
    """
    results = matrix.sweep.results
    with _held(results / ATTEMPTS_LOCK):
        attempt = max(next_attempt(results, pc.cell_id, repeat), earlier_attempt + 1)
        key = RunKey(matrix.sweep.name, pc.cell_id, repeat, attempt)
        run_dir = key.directory(results)
        run_dir.mkdir(parents=True)
    try:
        write_json_atomic(run_dir / SPEC, {
            "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
            "repeat": key.repeat, "attempt": key.attempt, "env_id": pc.env_id,
            "data_dir": str(data_dir), "params": pc.params,
            **({"canary": canary} if canary is not None else {}),
        })
    except BaseException:
        try:  # still empty: nothing ran, nothing to keep
            run_dir.rmdir()
        except OSError:
            pass
        raise
    return key, run_dir


@contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made when missing), held for the block."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def ok_runs_on_disk(results: Path, cell_id: str, repeat: int) -> list[Path]:
    """The run directories of (cell, repeat), in any sweep's folder of ``results``, whose
    ``result.json`` says ``ok`` (not validated further: ingest does that)."""
    found = []
    try:
        sweeps = sorted(entry for entry in results.iterdir() if not entry.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for sweep_dir in sweeps:
        try:
            entries = sorted((sweep_dir / cell_id).iterdir())
        except (FileNotFoundError, NotADirectoryError):
            continue
        for run_dir in entries:
            parsed = parse_run_dir_name(run_dir.name)
            if not parsed or parsed[0] != repeat:
                continue
            try:
                with open(run_dir / RESULT, "rb") as fh:
                    status = loads(fh.read(1 << 20)).get("status")  # never a RecursionError
            except (OSError, ValueError, AttributeError):
                continue
            if status == "ok":
                found.append(run_dir)
    return found


class RunClaim:
    """The right to run one (cell, repeat) of a results directory, shared by every sweep that
    writes there: an exclusive ``flock`` on ``<results>/.claims/<cell_id>-<repeat>.lock``, held
    from before the run's attempt is chosen until its bundle is ingested.  The kernel drops it
    when its process dies (kill -9 included), so a claim never outlives its holder.  The file
    holds the holder's pid and sweep, for the message of a sweep that waits."""

    def __init__(self, results: Path, cell_id: str, repeat: int, sweep: str) -> None:
        self.path = results / CLAIMS_DIR / f"{cell_id}-{repeat}.lock"
        self.sweep = sweep
        self._fd: int | None = None

    def take(self, *, wait: bool) -> bool:
        """Take the claim; without ``wait``, False when another process holds it."""
        self.path.parent.mkdir(exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _note_holder(fd, f"pid {os.getpid()}, sweep {self.sweep!r}")
        return True

    def holder(self) -> str:
        """Who holds the claim, as its file says."""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace").strip()[:200] or "another sweep"
        except OSError:
            return "another sweep"

    def release(self) -> None:
        if self._fd is None:
            return
        _note_holder(self._fd, "")
        os.close(self._fd)  # releases the lock
        self._fd = None


class SubmitClaim(RunClaim):
    """The right to choose and submit runs to a scheduler for a results directory: an
    asynchronous (Slurm) sweep holds it from reading which runs other sweeps of the directory
    have queued or running until its own submissions are recorded, so two Slurm sweeps that
    share cells never both submit one (their tasks run on the nodes, long after this host's
    sweep could have held a per-run claim)."""

    def __init__(self, results: Path, sweep: str) -> None:
        super().__init__(results, "", 0, sweep)
        self.path = results / CLAIMS_DIR / "scheduler-submit.lock"


def _note_holder(fd: int, text: str) -> None:
    """Write who holds a lock into its file, unbuffered: the text is only for messages, so a
    full disk (nothing written) does not matter and leaves nothing to flush later."""
    try:
        os.ftruncate(fd, 0)
        if text:
            os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass


def write_result(key: RunKey, run_dir: Path, env_id: str, executor: str,
                 host: dict[str, Any] | None, outcome: RunOutcome, design: dict[str, Any] | None = None) -> None:
    """``result.json``, last and atomically (also written by Slurm tasks and for runs Slurm ended).
    ``design``: an adaptive sweep's design (runner/sweep/adaptive.py ``design_record``)."""
    image = dict(outcome.image) if outcome.image else None
    release = _release_record(env_id) or ({"release": image.pop("release")} if image and "release" in image else {})
    write_json_atomic(run_dir / RESULT, {
        "schema_version": SCHEMA_VERSION, "sweep": key.sweep, "cell_id": key.cell_id,
        "repeat": key.repeat, "attempt": key.attempt, "env_id": env_id, "executor": executor,
        "status": outcome.status, "exit_code": outcome.exit_code, "error_tail": outcome.error_tail,
        "started_at": outcome.started_at, "ended_at": outcome.ended_at,
        "wall_seconds": outcome.wall_seconds, "host": host, "monitor": outcome.monitor,
        # The image the cell ran in (docker runtime): tag, ID, repo digests, content hash.
        "image": image,
        **({"design": design} if design else {}),
        **release,
    })


def _release_record(env_id: str) -> dict[str, Any]:
    """A release environment's lock (a cell's ``version``: runner/environments/releases.py),
    kept with every run of it as ``release``; nothing for other environments."""
    found = release_record(env_id)
    return {"release": found} if found else {}


def ingest_quietly(paths: list[Path], warehouse: Path, summary: SweepSummary) -> Any:
    """Ingest finished runs and count it in ``summary``; what the warehouse did not take goes
    to ``summary.skipped`` (the bundles are safe on disk: ``matrun ingest`` loads them later).
    Returns the ``IngestReport``, or None when the warehouse refused the whole ingest."""
    # Imported here: duckdb and pyarrow are heavy, and Slurm tasks import this module (for
    # write_result and host_info) on every node without ever ingesting.
    from matrun.warehouse.ingest import ingest

    try:
        report = ingest(paths, warehouse=warehouse, wait_s=INGEST_WAIT_S)
    except MatrunError as exc:  # the bundles are safe on disk; say how to load them later
        summary.skipped.extend(f"{path}: not ingested: {exc}" for path in paths)
        summary.skipped_paths.extend(paths)
        return None
    summary.add_ingest(report)
    return report


#: A synchronous sweep ingests a finished run at once unless its last ingest ended less than
#: this many times that ingest's own duration ago; then the run waits on disk for the next
#: ingest, which takes every waiting run in one transaction.  An ingest costs about the same
#: for one run as for twenty (DuckLake's statements and the cached views' refresh, ~2-3 s on a
#: 2-core host), so a sweep of runs shorter than that spent up to half its time ingesting;
#: spaced so, at most about a tenth of it goes there, and a run longer than this many
#: ingests is still ingested as it ends (docs/EXECUTORS.md "Ingest").
INGEST_SPACING = 10.0


class IngestQueue:
    """The finished runs of a synchronous sweep on their way into the warehouse: ``add`` one
    once its ``result.json`` is written; it is ingested with any others waiting when the last
    ingest is far enough behind (``INGEST_SPACING``), and ``flush`` ingests whatever waits
    (the sweep calls it whenever it ends, stopped or interrupted too).  Every waiting run is a
    complete bundle on disk: a sweep killed outright leaves them to the next sweep's catch-up."""

    def __init__(self, warehouse: Path, summary: SweepSummary, *, spacing: float = INGEST_SPACING,
                 clock: Callable[[], float] = time.monotonic,
                 ingest: Callable[[list[Path], Path, SweepSummary], Any] | None = None) -> None:
        self.warehouse, self.summary, self.spacing, self.clock = warehouse, summary, spacing, clock
        self._ingest = ingest or ingest_quietly
        self.waiting: list[Path] = []
        self.ingests = 0
        self._last_end: float | None = None
        self._last_cost = 0.0

    def add(self, run_dir: Path) -> None:
        """A finished run: ingested now, with the others waiting, or at the next ingest."""
        self.waiting.append(run_dir)
        if self._last_end is None or self.clock() - self._last_end >= self.spacing * self._last_cost:
            self.flush()

    def flush(self) -> None:
        """Ingest every waiting run (in one ingest); nothing when none waits."""
        if not self.waiting:
            return
        paths, self.waiting = self.waiting, []
        start = self.clock()
        try:
            self._ingest(paths, self.warehouse, self.summary)
        finally:
            self.ingests += 1
            self._last_end = self.clock()
            self._last_cost = self._last_end - start


@contextmanager
def sweep_lock(sweep_dir: Path, name: str) -> Iterator[None]:
    """One ``matrun sweep`` (or ``matrun cancel``'s recording) of a sweep at a time:
    ``SweepLocked`` names the process that holds it."""
    path = sweep_dir / ".sweep.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise SweepLocked(f"sweep {name!r} is already running in {holder} "
                              f"(lock {path}); wait for it or stop it first") from None
        _note_holder(fd, f"pid {os.getpid()}")
        try:
            yield
        finally:
            _note_holder(fd, "")
    finally:
        os.close(fd)


def host_info() -> dict[str, Any]:
    """What the host is, for provenance.  Fails soft: unknown fields are None."""
    cpu_model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "matrun_version": matrun.__version__,
    }
    gpu = host_gpu_facts()  # driver, CUDA driver version, each GPU (model, memory, MIG / ECC); NVML hosts only
    if gpu is not None:
        info["gpu"] = gpu
    return info


def with_state(host: dict[str, Any], params: dict[str, Any], watch: LoadWatch | None = None) -> dict[str, Any]:
    """``host`` with the machine's state just before a run of ``params`` starts (``host.state``:
    runner/sweep/machine.py), measured on the cell's CPUs (since ``watch`` last looked)."""
    try:
        cpus = parse_cpuset(params["cpuset"]) if params.get("cpuset") else None
        state: dict[str, Any] = machine_state(cpus or None, watch=watch)
    except (ValueError, OSError, psutil.Error) as exc:  # never a reason for a run not to run
        state = {"error": f"{type(exc).__name__}: {exc}"}
    return {**host, "state": state}
