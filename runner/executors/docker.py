"""The Docker executor: each cell in its own container of its framework's image.

Everything a cell's container is started with comes from one pure function,
``container_kwargs`` (tested exactly, GPU device requests included, since no GPU exists
here).  The container gets: no network, the cell's cpuset, a memory limit (swap included,
so a cell over it is OOM-killed rather than swapped), the cell's environment
(``cell_environment`` of the local executor, on top of the image's own environment, with
``PYTHONPATH`` pointing at the staged harness mounted read-only), the data directory
read-only and the bundle directory read-write, both at their host paths (so spec.json's
``data_dir`` and the harness's ``--out`` need no translation), a read-only root file
system with a private /tmp, no capabilities, no-new-privileges, a non-root user, and labels
naming the sweep, cell and run.

Where a cell's timeout is enforced: ``_wait`` below kills the container (status timeout).
The status comes from the engine: ``State.OOMKilled`` is oom.  A container is always
removed at the end; on Ctrl-C / SIGTERM (``KeyboardInterrupt`` / ``SystemExit``) it is
removed (killed) first and the exception passes on.  The logs are copied into the bundle
(stdout.log / stderr.log) whatever the status, and ``container.json`` records the image
(tag, id, repo digests) and the container for the result.

Faults (docs/EXECUTORS.md "Faults"):

- The engine stops answering mid-cell (stopped, restarted, its socket gone): ``_await_engine``
  asks it again every 0.2 s for ``ENGINE_GRACE_S``.  Back in time (answering steadily for a
  second): the wait goes on (the container ended with the engine, or lived through a live
  restore) and the run is recorded as it ended, with a note.  Still silent: the run is failed
  and ``RunAborted`` stops the sweep.  A stopping engine first kills its containers, and may
  answer that wait: a cell killed by SIGTERM / SIGKILL that matrun did not send is followed by
  a 10 s watch of the engine (``_watch_aftermath``; not after an OOM kill).
- ``kill -9`` of the sweep: the container's stdin is the cell's lease (``StdinLease``, attached
  before the start, ``OpenStdin`` + ``StdinOnce``): when this process dies the engine closes it
  and the harness stops the cell (runner/harness/lease.py).  Every container carries
  ``matrun.owner`` (host, boot, PID and start time of the process that started it) and
  ``matrun.run_dir``: the next sweep stops, records and removes what a dead owner left
  (runner/executors/orphans.py).
- The engine refusing the container, the image removed, the container removed or killed from
  outside: a failed run with the reason, never a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from matrun.errors import EnvironmentBuildError, MatrunError
from matrun.frameworks import get_framework
from matrun.runner.environments.engine import EngineUnavailable, connect, engine_url
from matrun.runner.environments.contexts import LABEL as IMAGE_LABEL, image_repository, recipe_hash
from matrun.runner.environments.home import HARNESS_MOUNT, matrun_home, stage_harness
from matrun.runner.environments.releases import env_variant, split_variant
from matrun.runner.executors.local import LEASE_FD, cell_environment, harness_command
from matrun.runner.executors.energy import EnergyMonitor, MonitorPair
from matrun.runner.executors.monitor_cgroup import CgroupMonitor
from matrun.runner.executors.outcomes import RunAborted, error_tail, refused_outcome, run_status
from matrun.runner.executors.protocol import RunOutcome, RunRequest, SyncExecutor
from matrun.runner.executors.workers import host_refusal, write_plan
from matrun.runner.harness.cpusets import parse_cpuset as cpuset_cpus
from matrun.runner.slurm.epilog import CLUSTER_LABEL as SLURM_CLUSTER_LABEL, JOB_LABEL as SLURM_JOB_LABEL
from matrun.warehouse.bundles.layout import GPU, MONITOR, SCHEMA_VERSION, SPEC, STDERR, STDOUT
from matrun.warehouse.bundles.write import tail_text, write_json_atomic

if TYPE_CHECKING:
    import docker

CONTAINER_JSON = "container.json"
DEFAULT_SHM_SIZE = "1g"  # the engine's 64 MiB default is too small for data-loader workers
TMPFS_SIZE = "1g"
NOBODY = 65534
#: Where a cell of a framework with ``compile_cache`` (framework.toml) sees its image's compile
#: cache (``compile_cache``), and the variable that tells the harness where it is.
COMPILE_CACHE_MOUNT = "/var/cache/matrun-compile"
COMPILE_CACHE_VARIABLE = "MATRUN_COMPILE_CACHE"
_WAIT_SLICE_S = 1.0
#: How long a cell waits for an engine that stopped answering before the sweep stops (a
#: ``systemctl restart docker`` stops the containers, up to 10 s each, then starts again).
ENGINE_GRACE_S = 30.0
#: An engine answers again once it has answered for this long without a miss (a stopping
#: engine answers a few last requests).
_STEADY_S = 1.0
#: How long the engine is watched after a cell killed by a signal matrun did not send: an engine
#: that stops or restarts kills its containers first, then stops answering (measured: about 1 s
#: later on an idle 2-core host, 3 s and more while it is busy; CI runs lost the note at 3 s and,
#: once in four full runs under the suite's two workers, at 10 s).
_AFTERMATH_S = 30.0
OWNER_LABEL = "matrun.owner"
RUN_DIR_LABEL = "matrun.run_dir"
ROLE_LABEL = "matrun.role"


@dataclass(frozen=True)
class ImageRef:
    """The image a framework variant runs in, as found in the engine."""

    tag: str
    image_id: str
    repo_digests: tuple[str, ...]
    content_hash: str
    env: tuple[str, ...]  # the image's own environment, KEY=VALUE
    release: str = ""  # a release's image (labels release and lock): what it installed
    lock: str = ""

    def as_record(self) -> dict[str, Any]:
        record = {"tag": self.tag, "id": self.image_id, "repo_digests": list(self.repo_digests),
                  "content_hash": self.content_hash}
        if self.release:  # result.json keeps it as ``release`` (records.py), as a venv's
            record["release"] = {"version": self.release, "lock": self.lock}
        return record


@dataclass(frozen=True)
class Owner:
    """The process that started a cell's container (the sweep, or a Slurm task), as the
    ``matrun.owner`` label records it: a container whose owner is dead was left by a sweep that
    was killed (``kill -9``, a crash) and nobody watches, records or removes it."""

    host: str
    boot: str  # /proc/sys/kernel/random/boot_id: a reboot ends every process of the host
    pid: int
    start: str  # the process's start, clock ticks since boot (/proc/PID/stat field 22): a reused PID differs

    @classmethod
    def this_process(cls) -> "Owner":
        return cls(socket.gethostname(), _boot_id(), os.getpid(), _process_start(os.getpid()) or "")

    def label(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> "Owner | None":
        """The owner a label names; None for a missing or malformed label."""
        try:
            data = json.loads(text or "")
            return cls(str(data["host"]), str(data["boot"]), int(data["pid"]), str(data["start"]))
        except (ValueError, TypeError, KeyError):
            return None

    def alive(self) -> bool | None:
        """Whether the owner still runs: None for a process of another host (not this host's to
        judge: engines can be shared), False when this host rebooted since or the PID is gone
        or now another process."""
        if self.host != socket.gethostname():
            return None
        if self.boot != _boot_id():
            return False
        start = _process_start(self.pid)
        return start is not None and start == self.start

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str | None:
    """The start of process ``pid`` in clock ticks since boot; None when there is no such process
    (or it is a zombie: it has ended, only its exit status is left)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


@dataclass(frozen=True)
class CellLabels:
    sweep: str
    cell: str
    run: str
    slurm_job: str = ""  # the Slurm job whose task started the container (its epilog removes it)
    slurm_cluster: str = ""  # and its cluster (job ids are only unique within one)
    run_dir: str = ""  # the bundle directory (absolute): where a dead sweep's run is recorded
    owner: str = ""  # ``Owner.label()`` of the process that starts the container

    def as_dict(self) -> dict[str, str]:
        labels = {"matrun.sweep": self.sweep, "matrun.cell": self.cell, "matrun.run": self.run,
                  ROLE_LABEL: "cell"}
        if self.slurm_job:
            labels[SLURM_JOB_LABEL] = self.slurm_job
        if self.slurm_cluster:
            labels[SLURM_CLUSTER_LABEL] = self.slurm_cluster
        if self.run_dir:
            labels[RUN_DIR_LABEL] = self.run_dir
        if self.owner:
            labels[OWNER_LABEL] = self.owner
        return labels


@dataclass
class DockerRunOutcome(RunOutcome):
    """A ``RunOutcome`` plus the container the cell ran in (its id, also in ``container.json``)."""

    container_id: str = ""


def image_environment(image_env: tuple[str, ...] | list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in image_env if "=" in item)


def device_requests(params: Mapping[str, Any]) -> list["docker.types.DeviceRequest"]:
    """GPU passthrough for a gpu cell: the first ``gpus`` GPUs, or exactly ``gpu_ids`` when given."""
    if params.get("device") != "gpu":
        return []
    import docker

    ids = params.get("gpu_ids")
    if ids:
        return [docker.types.DeviceRequest(device_ids=[str(i) for i in ids], capabilities=[["gpu"]])]
    return [docker.types.DeviceRequest(count=int(params["gpus"]), capabilities=[["gpu"]])]


def container_kwargs(params: Mapping[str, Any], *, image: ImageRef, run_dir: Path, data_dir: Path,
                     stage: Path, labels: CellLabels, user: str, memory_limit: int | str | None = None,
                     shm_size: str = DEFAULT_SHM_SIZE, plan: Path | None = None,
                     compile_cache: Path | None = None) -> dict[str, Any]:
    """The exact keyword arguments of ``client.containers.create`` for one cell (pure).

    ``create`` + ``start`` rather than ``run``: ``run`` pulls an image it cannot find, and
    no registry may be contacted from here (a cell's image is always local).  ``plan``: a
    multi-worker cell's launch plan (``<run>/workers.json``): the container's command is the
    launcher, which starts every worker inside this one container (no network: they talk over
    the container's own loopback).  ``compile_cache``: the image's compile cache on the host
    (:func:`compile_cache`), mounted at ``COMPILE_CACHE_MOUNT``.
    """
    run_dir, data_dir = run_dir.absolute(), data_dir.absolute()
    env = cell_environment(params, Path(HARNESS_MOUNT), base=image_environment(image.env))
    env["HOME"] = "/tmp"  # the root file system is read-only; frameworks write caches under HOME
    volumes = {str(stage): {"bind": HARNESS_MOUNT, "mode": "ro"},
               str(run_dir): {"bind": str(run_dir), "mode": "rw"}}
    if data_dir.is_dir() and data_dir != run_dir:
        volumes[str(data_dir)] = {"bind": str(data_dir), "mode": "ro"}
    if compile_cache is not None:
        volumes[str(compile_cache)] = {"bind": COMPILE_CACHE_MOUNT, "mode": "rw"}
        env[COMPILE_CACHE_VARIABLE] = COMPILE_CACHE_MOUNT
    kwargs: dict[str, Any] = {
        "image": image.image_id,
        # the image's PATH finds its venv first; the lease is the container's stdin (``StdinLease``)
        "command": harness_command(Path("python3"), run_dir, plan, lease_fd=LEASE_FD),
        "environment": env,
        "working_dir": str(run_dir),
        "user": user,
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={TMPFS_SIZE}"},
        "shm_size": shm_size,
        "volumes": volumes,
        "labels": labels.as_dict(),
        "stdin_open": True,  # with the SDK's detach left False: StdinOnce, closed when the lease ends
    }
    cpus = cpuset_cpus(params.get("cpuset") or "")
    if cpus:
        kwargs["cpuset_cpus"] = ",".join(str(c) for c in sorted(cpus))
    if memory_limit:
        kwargs["mem_limit"] = memory_limit
        kwargs["memswap_limit"] = memory_limit  # no swap beyond the limit: over it is an OOM kill
    requests = device_requests(params)
    if requests:
        kwargs["device_requests"] = requests
    return kwargs


def compile_cache(params: Mapping[str, Any], image: ImageRef, user: str) -> Path | None:
    """The host folder a cell of ``image`` compiles into when its framework says
    ``compile_cache = true`` (framework.toml: Theano), shared by every cell of that image run as
    ``user`` (``$MATRUN_HOME/compile/<framework>/<image id>-<uid>``, made and owned by that
    user): a container starts with an empty ``/tmp`` and a read-only root, so without it each
    Theano cell compiled every C module of its graph again (LeNet-5: 105-120 s on a 2-core host,
    against ~17 s for a cell that finds them).  Theano keys each module by its code, compiler
    flags and libraries (the variant's ``blas.ldflags``) and locks the folder, so cells that
    share it never load another's module.  None for other frameworks, and where the folder
    cannot be made the cell's user's (the cell then compiles in its run directory)."""
    framework = str(params.get("framework"))
    if not get_framework(framework).compile_cache:
        return None
    uid, gid = (int(part) for part in user.split(":"))
    path = matrun_home() / "compile" / framework / f"{image.image_id.split(':')[-1][:16]}-{uid}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        st = path.stat()
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(path, uid, gid)
        if st.st_mode & 0o777 != 0o700:
            os.chmod(path, 0o700)
    except OSError:  # not ours to give (or no space): the cell compiles in its run directory, as before
        return None
    return path


def cell_user(run_dir: Path) -> str:
    """The user the cell runs as: the owner of the bundle directory unless that is root, else nobody."""
    st = run_dir.stat()
    if st.st_uid != 0:
        return f"{st.st_uid}:{st.st_gid}"
    return f"{NOBODY}:{NOBODY}"


def _memory_limit(request: RunRequest) -> int | str | None:
    """The cell's memory limit, from its params (bytes or "512m"); None for none."""
    return request.params.get("memory_limit") or None


def _labels(run_dir: Path, slurm: tuple[str, str] = ("", "")) -> CellLabels:
    mine = {"run_dir": str(run_dir.absolute()), "owner": Owner.this_process().label()}
    try:
        spec = json.loads((run_dir / SPEC).read_text())
        return CellLabels(str(spec["sweep"]), str(spec["cell_id"]), f"{spec['repeat']}-{spec['attempt']}",
                          *slurm, **mine)
    except (OSError, ValueError, KeyError):
        return CellLabels("", run_dir.parent.name, run_dir.name, *slurm, **mine)


class StdinLease:
    """The cell's lease (runner/harness/lease.py) on the docker side: the container's stdin,
    attached before it starts and held while the executor waits for it.  The container is
    created with ``OpenStdin`` and ``StdinOnce``, so the engine closes its stdin when this
    attachment ends: when the run is over (``release``), or — ``kill -9`` of the sweep, of a
    Slurm task — when the kernel closes this process's socket.  The harness then reads
    end-of-file and stops the cell.  Nothing is ever written to it."""

    def __init__(self) -> None:
        self._socket: Any = None

    def hold(self, container: Any) -> None:
        self._socket = container.attach_socket(params={"stdin": 1, "stream": 1})

    def release(self) -> None:
        """End the attachment (shut down, so the engine sees it end whatever else holds the
        socket) and close it; nothing when none is held."""
        if self._socket is None:
            return
        raw = getattr(self._socket, "_sock", self._socket)  # the SDK's SocketIO over a unix socket
        for end in (lambda: raw.shutdown(socket.SHUT_RDWR), self._socket.close, raw.close):
            try:
                end()
            except OSError:
                pass
        self._socket = None


class _EngineSilent(Exception):
    """The engine answered nothing for the executor's grace period (internal to ``run``)."""


class _ContainerGone(Exception):
    """The cell's container vanished from the engine mid-cell (``docker rm -f`` from outside)."""


def no_answer(exc: BaseException) -> bool:
    """Whether an error of the Docker SDK means the engine did not answer at all (stopped,
    restarting, its socket gone), rather than answering with a refusal (``APIError``)."""
    import requests

    return (isinstance(exc, requests.exceptions.RequestException)
            and not isinstance(exc, requests.exceptions.HTTPError))


def _read_timeout(exc: BaseException) -> bool:
    """Whether a slice of ``container.wait`` simply ended (the SDK raises a read timeout on a unix
    socket as a ``ConnectionError``), as opposed to the engine going away."""
    import requests
    import urllib3

    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return (isinstance(exc, requests.exceptions.ConnectionError)
            and any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args))


class DockerExecutor(SyncExecutor):
    name = "docker"
    enforces = frozenset({"memory_limit", "cpuset"})

    def __init__(self, client: "docker.DockerClient | None" = None, *,
                 images: Mapping[tuple[str, str], str] | None = None, shm_size: str = DEFAULT_SHM_SIZE,
                 docker_host: str | None = None, slurm_job: str = "", slurm_cluster: str = "",
                 engine_grace: float = ENGINE_GRACE_S) -> None:
        self._client = client
        # set by a Slurm task: the labels runner/slurm/epilog.py finds the task's containers by
        self.slurm = (slurm_job, slurm_cluster)
        self._docker_host = docker_host
        self._images = dict(images or {})  # (framework, variant) → tag; else the newest labelled image
        self._refs: dict[tuple[str, str], ImageRef] = {}
        self.shm_size = shm_size
        self.engine_grace = engine_grace  # seconds an engine that stopped answering is waited for
        self._gaps: list[float] = []  # this run's: seconds the engine answered nothing, each time

    @property
    def client(self) -> "docker.DockerClient":
        if self._client is None:
            self._client = connect(self._docker_host)
        return self._client

    @property
    def url(self) -> str:
        """The engine's address, as messages name it."""
        try:
            return engine_url(self._docker_host)
        except MatrunError:
            return str(self._docker_host)

    def image(self, framework: str, variant: str) -> ImageRef:
        key = (framework, variant)
        if key not in self._refs:
            self._refs[key] = self._find_image(framework, variant)
        return self._refs[key]

    def _find_image(self, framework: str, variant: str) -> ImageRef:
        import docker

        tag = self._images.get((framework, variant))
        recipe = recipe_hash(framework, variant)
        try:
            if tag:
                found = self.client.images.get(tag)
            else:
                base, release = split_variant(variant)
                labels = [f"{IMAGE_LABEL}.framework={framework}", f"{IMAGE_LABEL}.variant={base}",
                          f"{IMAGE_LABEL}.recipe-hash={recipe}", *([f"{IMAGE_LABEL}.release={release}"] if release else [])]
                candidates = self.client.images.list(filters={"label": labels})
                if not candidates:
                    raise docker.errors.ImageNotFound(f"{framework}:{variant}")
                found = max(candidates, key=lambda im: im.attrs.get("Created", ""))
        except docker.errors.ImageNotFound:
            raise EnvironmentBuildError(
                f"no image for {framework}:{variant} built from the current recipe "
                f"(images/{framework}/, recipe {recipe[:12]}) in the Docker engine; build it with "
                f"`matrun build` (or pick --executor local)") from None
        except docker.errors.APIError as exc:
            raise EnvironmentBuildError(f"the Docker engine at {self.url} refused to list the images of "
                                        f"{framework}:{variant}: {exc}") from None
        except Exception as exc:
            if not no_answer(exc):
                raise
            raise EngineUnavailable(f"the Docker engine at {self.url} did not answer while looking for "
                                    f"the image of {framework}:{variant}: {exc}") from None
        attrs = found.attrs
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        tags = [t for t in found.tags if t.startswith(f"{image_repository(framework)}:")] or found.tags
        return ImageRef(tag=tag or (tags[0] if tags else found.id), image_id=found.id,
                        repo_digests=tuple(attrs.get("RepoDigests") or ()),
                        content_hash=labels.get(f"{IMAGE_LABEL}.content-hash", ""),
                        env=tuple((attrs.get("Config") or {}).get("Env") or ()),
                        release=labels.get(f"{IMAGE_LABEL}.release", ""), lock=labels.get(f"{IMAGE_LABEL}.lock", ""))

    def env_id(self, framework: str, variant: str) -> str:
        """The recipe (Dockerfile, pins, build arguments), known before any build: editing a
        recipe gives new cell ids; the exact image a run used is on the run (``image``)."""
        base, release = split_variant(variant)  # a release: cpu@2.4.1, its recipe the release's request
        return f"{framework}-{base}-{release + '-' if release else ''}{recipe_hash(framework, variant)[:12]}"

    def prepare(self, envs: set[tuple[str, str]], *, log: Callable[[str], None]) -> None:
        for framework, variant in sorted(envs):
            ref = self.image(framework, variant)
            log(f"image {ref.tag} ({ref.image_id[:19]})")
        stage_harness()

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run the cell (``nodes`` > 1: one container on one host), or
        None; the sweep asks before anything runs."""
        return host_refusal(params, self.name)

    # --- one cell ------------------------------------------------------------------------------

    def run(self, request: RunRequest) -> DockerRunOutcome:
        lease = StdinLease()  # held from before the container starts until the run is over
        try:
            return self._run(request, lease)
        finally:
            lease.release()

    def _run(self, request: RunRequest, lease: StdinLease) -> DockerRunOutcome:
        import docker

        params, run_dir = request.params, request.run_dir.absolute()
        refused = self.refusal(params)
        if refused:
            return DockerRunOutcome(**vars(refused_outcome(run_dir, refused, datetime.now(timezone.utc))))
        ref = self.image(params["framework"], env_variant(params))
        owner = run_dir.stat()
        user = cell_user(run_dir)
        if user == f"{NOBODY}:{NOBODY}":  # a root-owned bundle: let nobody write into this run only
            os.chown(run_dir, NOBODY, NOBODY)
        # A multi-worker cell: every worker in this one container (the network is already none).
        plan = write_plan(run_dir, params, network="inherit")
        labels = _labels(run_dir, self.slurm)
        kwargs = container_kwargs(params, image=ref, run_dir=run_dir, data_dir=request.data_dir,
                                  stage=stage_harness(), labels=labels, user=user,
                                  memory_limit=_memory_limit(request), shm_size=self.shm_size, plan=plan,
                                  compile_cache=compile_cache(params, ref, user))
        started = datetime.now(timezone.utc)
        t0 = time.monotonic()
        container = None
        monitor = None
        self._gaps = []

        def ended(note: str, *, exit_code: int | None = None, remove: bool = True) -> DockerRunOutcome:
            """A run that ended abnormally: failed, with the reason (the container removed when the
            engine still answers)."""
            aggregates = monitor.stop() if monitor is not None else {}
            if container is not None and remove:
                save_logs(container, run_dir)
                remove_container(container)
            for name in (STDOUT, STDERR):
                (run_dir / name).touch()
            give_back(run_dir, owner)
            return DockerRunOutcome(
                status="failed", exit_code=exit_code,
                error_tail=f"{tail_text(run_dir / STDERR)}\n[matrun] {note}".lstrip("\n"),
                started_at=started.isoformat(), ended_at=datetime.now(timezone.utc).isoformat(),
                wall_seconds=round(time.monotonic() - t0, 3), monitor=aggregates, image=ref.as_record(),
                container_id=container.id if container is not None else "")

        try:
            try:
                container = self.client.containers.create(**kwargs)
                lease.hold(container)
                container.start()
            except docker.errors.APIError as exc:  # refused by the engine: a failed run, not a crash
                return self._refused(exc, container, run_dir, owner, ref, started, t0)
            except Exception as exc:
                if not no_answer(exc):
                    raise
                back = self._await_engine()
                container = container or self._container_of(labels)  # a create that reached the engine
                return self._refused(RuntimeError(
                    f"it stopped answering as the container was created (the engine at {self.url} answered "
                    f"again {back:.0f} s later); the cell did not run"), container, run_dir, owner, ref, started, t0)
            self._ask(container.reload)
            monitor = MonitorPair(CgroupMonitor(container.id, run_dir / MONITOR,
                                                pid=container.attrs["State"].get("Pid")),
                                  EnergyMonitor(run_dir / GPU, params)).start()
            exit_code, timed_out = self._wait(container, request.timeout)
            aggregates = monitor.stop()
            try:
                self._ask(container.reload)
            except docker.errors.NotFound:  # `docker rm -f`: killed, then removed
                raise _ContainerGone() from None
            oom = bool(container.attrs["State"].get("OOMKilled"))
            if exit_code in (128 + 9, 128 + 15) and not (timed_out or oom or self._gaps):
                self._watch_aftermath()  # killed by the engine on its way down?
                try:
                    self._ask(container.reload)
                except docker.errors.NotFound:
                    raise _ContainerGone() from None
            save_logs(container, run_dir)
        except _EngineSilent:
            when = "mid-cell" if monitor is not None else "as the cell's container was created"
            outcome = ended(f"the Docker engine at {self.url} stopped answering {when} and did not answer "
                            f"again within {self.engine_grace:g} s; the sweep stopped (the container, if the "
                            f"engine comes back with it, is removed by the next sweep)", remove=False)
            raise RunAborted(
                f"the Docker engine at {self.url} stopped answering {when} (run {run_dir}) and did not "
                f"answer again within {self.engine_grace:g} s: the run is recorded failed and the sweep stops "
                "here. Start the engine again (`matrun engine start`, or your system's service) and run "
                "the sweep again: it runs what is not done", outcome) from None
        except _ContainerGone:
            return ended("the cell's container was removed mid-cell from outside matrun (docker rm -f?); "
                         "its logs went with it", remove=False)
        except (docker.errors.DockerException, OSError) as exc:  # an error answer, or one more lost answer
            if not isinstance(exc, docker.errors.DockerException) and not no_answer(exc):
                raise  # an OSError of the bundle's own files (a full disk): the sweep's to report
            return ended(f"the Docker engine at {self.url} failed mid-cell: {exc}")
        except BaseException:  # Ctrl-C, SIGTERM as SystemExit
            if monitor is not None:
                monitor.stop()
            if container is not None:
                save_logs(container, run_dir)
                remove_container(container)
            give_back(run_dir, owner)
            raise
        remove_container(container)
        give_back(run_dir, owner)
        wall = time.monotonic() - t0
        status = "oom" if oom and not timed_out else run_status(exit_code, timed_out, run_dir, run_dir)
        write_json_atomic(run_dir / CONTAINER_JSON, {
            "schema_version": SCHEMA_VERSION, "image": ref.as_record(), "container_id": container.id,
            "user": user, "cpuset_cpus": kwargs.get("cpuset_cpus"), "mem_limit": kwargs.get("mem_limit"),
            "oom_killed": oom, "exit_code": exit_code})
        tail = "" if status == "ok" else _docker_error_tail(run_dir, status, timed_out, request.timeout, exit_code)
        if self._gaps and status != "ok":
            tail += (f"\n[matrun] the Docker engine at {self.url} stopped answering mid-cell and answered "
                     f"again {sum(self._gaps):.0f} s later (an engine that restarts stops its containers)")
        return DockerRunOutcome(
            status=status, exit_code=exit_code, error_tail=tail,
            started_at=started.isoformat(), ended_at=datetime.now(timezone.utc).isoformat(),
            wall_seconds=round(wall, 3), monitor=aggregates, image=ref.as_record(), container_id=container.id)

    def _refused(self, exc: Exception, container: Any, run_dir: Path, owner: os.stat_result, ref: ImageRef,
                 started: datetime, t0: float) -> DockerRunOutcome:
        if container is not None:
            save_logs(container, run_dir)
            remove_container(container)
        else:
            for name in (STDOUT, STDERR):
                (run_dir / name).touch()
        give_back(run_dir, owner)
        return DockerRunOutcome(
            status="failed", exit_code=None,
            error_tail=f"[matrun] the Docker engine did not start the cell's container: {exc}",
            started_at=started.isoformat(), ended_at=datetime.now(timezone.utc).isoformat(),
            wall_seconds=round(time.monotonic() - t0, 3), monitor={}, image=ref.as_record(),
            container_id=container.id if container is not None else "")

    # --- talking to an engine that may go away -------------------------------------------------

    def _await_engine(self) -> float:
        """The engine stopped answering: ask it again every 0.2 s; the seconds until it answered
        (and went on answering for ``_STEADY_S``), or ``_EngineSilent`` after ``engine_grace``
        seconds of silence.  Each gap is kept in ``_gaps``, for the run's error."""
        lost = time.monotonic()
        steady_since = None
        while True:
            if self._answers():
                steady_since = steady_since or time.monotonic()
                if time.monotonic() - steady_since >= _STEADY_S:
                    self._gaps.append(steady_since - lost)
                    return steady_since - lost
            else:
                steady_since = None
                if time.monotonic() - lost >= self.engine_grace:
                    raise _EngineSilent()
            time.sleep(0.2)

    def _watch_aftermath(self) -> None:
        """After a cell killed by SIGTERM / SIGKILL that matrun did not send: watch the engine for
        ``_AFTERMATH_S`` (an engine that stops kills its containers, then stops answering) and
        wait for it (``_await_engine``) if it goes."""
        end = time.monotonic() + _AFTERMATH_S
        while time.monotonic() < end:
            if not self._answers():
                self._await_engine()
                return
            time.sleep(0.2)

    def _ask(self, call: Callable[[], Any]) -> Any:
        """``call()``, through a restart of the engine (``_EngineSilent`` when it stays away)."""
        for _ in range(3):
            try:
                return call()
            except Exception as exc:
                if not no_answer(exc):
                    raise
                self._await_engine()
        return call()

    def _container_of(self, labels: CellLabels) -> Any:
        """The container this process created for the run, if the engine has one."""
        try:
            found = self.client.containers.list(all=True, filters={"label": [
                f"{RUN_DIR_LABEL}={labels.run_dir}", f"{OWNER_LABEL}={labels.owner}"]})
        except Exception:
            return None
        return found[0] if found else None

    def _wait(self, container: Any, timeout: float) -> tuple[int | None, bool]:
        """Wait for the container to exit; kill it at the deadline.  (exit code, timed out).  An
        engine that stops answering is waited for (``_await_engine``): back, the wait goes on —
        the container ended with the engine, or lived through a live restore —; still silent,
        ``_EngineSilent``.  The container removed from outside: ``_ContainerGone``."""
        import docker

        deadline = time.monotonic() + timeout
        errors = 0
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    try:
                        container.kill()
                    except docker.errors.APIError:  # it exited in between
                        pass
                    try:
                        return container.wait(timeout=30).get("StatusCode"), True
                    except Exception as exc:
                        if _read_timeout(exc):  # killed but not reaped within 30 s: no exit code
                            return None, True
                        raise
                result = container.wait(timeout=max(1, int(min(left, _WAIT_SLICE_S) + 0.999)))
                return result.get("StatusCode"), False
            except docker.errors.NotFound:
                raise _ContainerGone() from None
            except Exception as exc:
                if _read_timeout(exc):
                    continue
                if no_answer(exc) or not self._answers():
                    self._await_engine()
                    continue
                errors += 1  # an error answer: ask again, a few times
                if errors >= 3:
                    raise
                time.sleep(0.5)

    def _answers(self) -> bool:
        try:
            self.client.ping()
            return True
        except Exception:
            return False


def save_logs(container: Any, run_dir: Path) -> None:
    for name, out, err in ((STDOUT, True, False), (STDERR, False, True)):
        try:
            (run_dir / name).write_bytes(container.logs(stdout=out, stderr=err))
        except Exception:  # the engine lost it: keep what we have
            (run_dir / name).touch()


def remove_container(container: Any) -> None:
    try:
        container.remove(force=True)  # kills a running container first
    except Exception:
        pass


def give_back(run_dir: Path, owner: os.stat_result) -> None:
    """Files the cell wrote as nobody go back to the bundle's owner."""
    if owner.st_uid != 0 or os.geteuid() != 0:
        return
    paths = [run_dir]
    for root, dirs, files in os.walk(run_dir):  # a multi-worker cell's workers/ tree too
        paths += [Path(root) / name for name in (*dirs, *files)]
    for path in paths:
        try:
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)
        except OSError:
            pass


def _docker_error_tail(run_dir: Path, status: str, timed_out: bool, timeout: float,
                       exit_code: int | None) -> str:
    if status == "oom":
        return (tail_text(run_dir / STDERR) + "\n[matrun] killed by the kernel's OOM killer: the container "
                "went over its memory limit").lstrip("\n")
    # the container's exit code 128+N is signal N; the local executor's wording wants -N
    code = -(exit_code - 128) if exit_code is not None and exit_code > 128 and not timed_out else exit_code
    return error_tail(run_dir, timed_out, timeout, code,
                      sigkill="from outside the cell: `docker kill`, `docker rm -f`, or the host's OOM killer; "
                              "the engine reports no OOM kill of the container")
