"""Executors by name.  ``auto`` resolves to the best one available on this host.  And what a
dead sweep left running that an executor can find (``reap_orphans``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

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


def reap_orphans(runner: Executor, *, log: Callable[[str], None]) -> list[Path]:
    """Before a sweep catches up and runs anything: stop what sweeps killed outright (SIGKILL)
    left running and record those runs, so that the catch-up ingests them and nothing trains
    beside the cells measured now.  The docker executor's containers
    (``DockerExecutor.reap_orphans``); the local executor's cells die with their sweep
    (``PR_SET_PDEATHSIG``) and Slurm's are the Slurm epilog's.  The run directories recorded."""
    if isinstance(runner, DockerExecutor):
        return runner.reap_orphans(log=log)
    return []
