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
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from matrun.errors import EnvironmentBuildError
from matrun.runner.environments.engine import connect
from matrun.runner.environments.contexts import LABEL as IMAGE_LABEL, image_repository, recipe_hash
from matrun.runner.environments.home import HARNESS_MOUNT, stage_harness
from matrun.runner.executors.local import cell_environment, harness_command
from matrun.runner.executors.monitor_cgroup import CgroupMonitor
from matrun.runner.executors.outcomes import error_tail, refused_outcome, run_status
from matrun.runner.executors.protocol import RunOutcome, RunRequest, SyncExecutor
from matrun.runner.executors.workers import host_refusal, write_plan
from matrun.runner.harness.cpusets import parse_cpuset as cpuset_cpus
from matrun.runner.slurm.epilog import CLUSTER_LABEL as SLURM_CLUSTER_LABEL, JOB_LABEL as SLURM_JOB_LABEL
from matrun.warehouse.bundles.layout import MONITOR, SCHEMA_VERSION, SPEC, STDERR, STDOUT
from matrun.warehouse.bundles.write import tail_text, write_json_atomic

if TYPE_CHECKING:
    import docker

CONTAINER_JSON = "container.json"
DEFAULT_SHM_SIZE = "1g"  # the engine's 64 MiB default is too small for data-loader workers
TMPFS_SIZE = "1g"
NOBODY = 65534
_WAIT_SLICE_S = 1.0


@dataclass(frozen=True)
class ImageRef:
    """The image a framework variant runs in, as found in the engine."""

    tag: str
    image_id: str
    repo_digests: tuple[str, ...]
    content_hash: str
    env: tuple[str, ...]  # the image's own environment, KEY=VALUE

    def as_record(self) -> dict[str, Any]:
        return {"tag": self.tag, "id": self.image_id, "repo_digests": list(self.repo_digests),
                "content_hash": self.content_hash}


@dataclass(frozen=True)
class CellLabels:
    sweep: str
    cell: str
    run: str
    slurm_job: str = ""  # the Slurm job whose task started the container (its epilog removes it)
    slurm_cluster: str = ""  # and its cluster (job ids are only unique within one)

    def as_dict(self) -> dict[str, str]:
        labels = {"matrun.sweep": self.sweep, "matrun.cell": self.cell, "matrun.run": self.run,
                  "matrun.role": "cell"}
        if self.slurm_job:
            labels[SLURM_JOB_LABEL] = self.slurm_job
        if self.slurm_cluster:
            labels[SLURM_CLUSTER_LABEL] = self.slurm_cluster
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
                     shm_size: str = DEFAULT_SHM_SIZE, plan: Path | None = None) -> dict[str, Any]:
    """The exact keyword arguments of ``client.containers.create`` for one cell (pure).

    ``create`` + ``start`` rather than ``run``: ``run`` pulls an image it cannot find, and
    no registry may be contacted from here (a cell's image is always local).  ``plan``: a
    multi-worker cell's launch plan (``<run>/workers.json``): the container's command is the
    launcher, which starts every worker inside this one container (no network: they talk over
    the container's own loopback).
    """
    run_dir, data_dir = run_dir.absolute(), data_dir.absolute()
    env = cell_environment(params, Path(HARNESS_MOUNT), base=image_environment(image.env))
    env["HOME"] = "/tmp"  # the root file system is read-only; frameworks write caches under HOME
    volumes = {str(stage): {"bind": HARNESS_MOUNT, "mode": "ro"},
               str(run_dir): {"bind": str(run_dir), "mode": "rw"}}
    if data_dir.is_dir() and data_dir != run_dir:
        volumes[str(data_dir)] = {"bind": str(data_dir), "mode": "ro"}
    kwargs: dict[str, Any] = {
        "image": image.image_id,
        "command": harness_command(Path("python3"), run_dir, plan),  # the image's PATH finds its venv first
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
        "stdin_open": False,
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
    try:
        spec = json.loads((run_dir / SPEC).read_text())
        return CellLabels(str(spec["sweep"]), str(spec["cell_id"]), f"{spec['repeat']}-{spec['attempt']}", *slurm)
    except (OSError, ValueError, KeyError):
        return CellLabels("", run_dir.parent.name, run_dir.name, *slurm)


class DockerExecutor(SyncExecutor):
    name = "docker"
    enforces = frozenset({"memory_limit", "cpuset"})

    def __init__(self, client: "docker.DockerClient | None" = None, *,
                 images: Mapping[tuple[str, str], str] | None = None, shm_size: str = DEFAULT_SHM_SIZE,
                 docker_host: str | None = None, slurm_job: str = "", slurm_cluster: str = "") -> None:
        self._client = client
        # set by a Slurm task: the labels runner/slurm/epilog.py finds the task's containers by
        self.slurm = (slurm_job, slurm_cluster)
        self._docker_host = docker_host
        self._images = dict(images or {})  # (framework, variant) → tag; else the newest labelled image
        self._refs: dict[tuple[str, str], ImageRef] = {}
        self.shm_size = shm_size

    @property
    def client(self) -> "docker.DockerClient":
        if self._client is None:
            self._client = connect(self._docker_host)
        return self._client

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
                labels = [f"{IMAGE_LABEL}.framework={framework}", f"{IMAGE_LABEL}.variant={variant}",
                          f"{IMAGE_LABEL}.recipe-hash={recipe}"]
                candidates = self.client.images.list(filters={"label": labels})
                if not candidates:
                    raise docker.errors.ImageNotFound(f"{framework}:{variant}")
                found = max(candidates, key=lambda im: im.attrs.get("Created", ""))
        except docker.errors.ImageNotFound:
            raise EnvironmentBuildError(
                f"no image for {framework}:{variant} built from the current recipe "
                f"(images/{framework}/, recipe {recipe[:12]}) in the Docker engine; build it with "
                f"`matrun build` (or pick --executor local)") from None
        attrs = found.attrs
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        tags = [t for t in found.tags if t.startswith(f"{image_repository(framework)}:")] or found.tags
        return ImageRef(tag=tag or (tags[0] if tags else found.id), image_id=found.id,
                        repo_digests=tuple(attrs.get("RepoDigests") or ()),
                        content_hash=labels.get(f"{IMAGE_LABEL}.content-hash", ""),
                        env=tuple((attrs.get("Config") or {}).get("Env") or ()))

    def env_id(self, framework: str, variant: str) -> str:
        """The recipe (Dockerfile, pins, build arguments), known before any build: editing a
        recipe gives new cell ids; the exact image a run used is on the run (``image``)."""
        return f"{framework}-{variant}-{recipe_hash(framework, variant)[:12]}"

    def prepare(self, envs: set[tuple[str, str]], *, log: Callable[[str], None]) -> None:
        for framework, variant in sorted(envs):
            ref = self.image(framework, variant)
            log(f"image {ref.tag} ({ref.image_id[:19]})")
        stage_harness()

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run the cell (``nodes`` > 1: one container on one host), or
        None; the sweep asks before anything runs."""
        return host_refusal(params, self.name)

    def run(self, request: RunRequest) -> DockerRunOutcome:
        import docker

        params, run_dir = request.params, request.run_dir.absolute()
        refused = self.refusal(params)
        if refused:
            return DockerRunOutcome(**vars(refused_outcome(run_dir, refused, datetime.now(timezone.utc))))
        ref = self.image(params["framework"], params["variant"])
        owner = run_dir.stat()
        user = cell_user(run_dir)
        if user == f"{NOBODY}:{NOBODY}":  # a root-owned bundle: let nobody write into this run only
            os.chown(run_dir, NOBODY, NOBODY)
        # A multi-worker cell: every worker in this one container (the network is already none).
        plan = write_plan(run_dir, params, network="inherit")
        kwargs = container_kwargs(params, image=ref, run_dir=run_dir, data_dir=request.data_dir,
                                  stage=stage_harness(), labels=_labels(run_dir, self.slurm), user=user,
                                  memory_limit=_memory_limit(request), shm_size=self.shm_size, plan=plan)
        started = datetime.now(timezone.utc)
        t0 = time.monotonic()
        container = None
        monitor = None
        try:
            try:
                container = self.client.containers.create(**kwargs)
                container.start()
            except docker.errors.APIError as exc:  # refused by the engine: a failed run, not a crash
                return self._refused(exc, container, run_dir, owner, ref, started, t0)
            container.reload()
            monitor = CgroupMonitor(container.id, run_dir / MONITOR,
                                    pid=container.attrs["State"].get("Pid")).start()
            exit_code, timed_out = _wait(container, request.timeout)
            aggregates = monitor.stop()
            container.reload()
            oom = bool(container.attrs["State"].get("OOMKilled"))
            _save_logs(container, run_dir)
        except BaseException:  # Ctrl-C, SIGTERM as SystemExit, or the engine failing mid-run
            if monitor is not None:
                monitor.stop()
            if container is not None:
                _save_logs(container, run_dir)
                _remove(container)
            _give_back(run_dir, owner)
            raise
        _remove(container)
        _give_back(run_dir, owner)
        wall = time.monotonic() - t0
        status = "oom" if oom and not timed_out else run_status(exit_code, timed_out, run_dir, run_dir)
        write_json_atomic(run_dir / CONTAINER_JSON, {
            "schema_version": SCHEMA_VERSION, "image": ref.as_record(), "container_id": container.id,
            "user": user, "cpuset_cpus": kwargs.get("cpuset_cpus"), "mem_limit": kwargs.get("mem_limit"),
            "oom_killed": oom, "exit_code": exit_code})
        return DockerRunOutcome(
            status=status, exit_code=exit_code,
            error_tail="" if status == "ok" else _docker_error_tail(run_dir, status, timed_out,
                                                                    request.timeout, exit_code),
            started_at=started.isoformat(), ended_at=datetime.now(timezone.utc).isoformat(),
            wall_seconds=round(wall, 3), monitor=aggregates, image=ref.as_record(), container_id=container.id)

    def _refused(self, exc: Exception, container: Any, run_dir: Path, owner: os.stat_result, ref: ImageRef,
                 started: datetime, t0: float) -> DockerRunOutcome:
        if container is not None:
            _save_logs(container, run_dir)
            _remove(container)
        else:
            for name in (STDOUT, STDERR):
                (run_dir / name).touch()
        _give_back(run_dir, owner)
        return DockerRunOutcome(
            status="failed", exit_code=None,
            error_tail=f"[matrun] the Docker engine did not start the cell's container: {exc}",
            started_at=started.isoformat(), ended_at=datetime.now(timezone.utc).isoformat(),
            wall_seconds=round(time.monotonic() - t0, 3), monitor={}, image=ref.as_record(),
            container_id=container.id if container is not None else "")


def _wait(container: Any, timeout: float) -> tuple[int | None, bool]:
    """Wait for the container to exit; kill it at the deadline.  (exit code, timed out)."""
    import requests

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            try:
                container.kill()
            except Exception:  # it exited in between
                pass
            code = container.wait(timeout=30).get("StatusCode")
            return code, True
        try:
            result = container.wait(timeout=max(1, int(min(left, _WAIT_SLICE_S) + 0.999)))
            return result.get("StatusCode"), False
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            continue


def _save_logs(container: Any, run_dir: Path) -> None:
    for name, out, err in ((STDOUT, True, False), (STDERR, False, True)):
        try:
            (run_dir / name).write_bytes(container.logs(stdout=out, stderr=err))
        except Exception:  # the engine lost it: keep what we have
            (run_dir / name).touch()


def _remove(container: Any) -> None:
    try:
        container.remove(force=True)  # kills a running container first
    except Exception:
        pass


def _give_back(run_dir: Path, owner: os.stat_result) -> None:
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
    return error_tail(run_dir, timed_out, timeout, code)
