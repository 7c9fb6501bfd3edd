"""Executors by name.  ``auto`` resolves to the best one available on this host."""

from __future__ import annotations

from matrun.errors import InputError
from matrun.runner.environments.engine import engine_url, find_engine
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.protocol import Executor
from matrun.runner.slurm.executor import SlurmExecutor
from matrun.runner.slurm.settings import SlurmSettings

EXECUTORS: dict[str, type[Executor]] = {"local": LocalExecutor, "docker": DockerExecutor, "slurm": SlurmExecutor}


def get_executor(name: str, *, docker_host: str | None = None,
                 slurm: SlurmSettings | None = None) -> tuple[Executor, str]:
    """The executor for ``name`` and a sentence saying what was picked and why.

    ``auto`` picks docker when a local Docker engine answers (``DOCKER_HOST`` or the default
    socket), else the local executor, the embedded default; it never picks slurm (submitting
    to a cluster is asked for by name).  ``slurm``: the settings of the slurm executor.
    """
    if name == "auto":
        try:
            url = engine_url(docker_host)
            client = find_engine(docker_host)
        except InputError as exc:  # DOCKER_HOST names something matrun refuses to talk to
            return LocalExecutor(), f"executor: local (auto: {exc})"
        if client is not None:
            return (DockerExecutor(client, docker_host=docker_host),
                    f"executor: docker (auto: a Docker engine answers at {url})")
        return LocalExecutor(), f"executor: local (auto: no Docker engine answers at {url})"
    cls = EXECUTORS.get(name)
    if cls is None:
        raise InputError(f"unknown executor {name!r}; available: auto, {', '.join(EXECUTORS)}")
    if cls is DockerExecutor:
        return DockerExecutor(docker_host=docker_host), f"executor: {name}"
    if cls is SlurmExecutor:
        runtime = slurm.runtime if slurm is not None else "docker"
        return SlurmExecutor(slurm, docker_host=docker_host), (
            f"executor: {name} (job arrays; each task runs its cell with the {runtime} executor on its node)")
    return cls(), f"executor: {name}"

