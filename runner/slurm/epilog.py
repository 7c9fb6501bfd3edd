"""Slurm epilog: remove the containers a matrun task left when Slurm killed it with SIGKILL.

A cell's container is not a child of its Slurm task (the engine starts it), so Slurm's process
tracking cannot kill it.  The task traps SIGTERM and removes its container itself
(``runner/slurm/task.py``); but a task killed outright (SIGKILL: ``scancel --signal=KILL``, a
``KillWait`` shorter than the clean-up, the task's own memory limit, an operator's ``kill -9``)
leaves its container running, still using the CPUs and GPUs Slurm has already given to the next
job.  Slurm runs its ``Epilog`` program on every node of a job as it ends, as root, with
``SLURM_JOB_ID`` and ``SLURM_CLUSTER_NAME`` set; this one removes every container labelled
``matrun.slurm_job=<that id>`` whose ``matrun.slurm_cluster`` label, where it has one, names the
same cluster (the docker executor sets both labels on the containers it starts inside a Slurm
task; a job id is only unique within one cluster).

Install it in slurm.conf on the nodes (``Epilog=<venv>/bin/matrun-slurm-epilog``, or as one
script of an ``Epilog=/etc/slurm/epilog.d/*`` glob).  It asks the engine at ``DOCKER_HOST``
where the epilog's environment sets one, the system socket, and the job user's rootless socket
(``/run/user/<SLURM_JOB_UID>/docker.sock``), whichever exist.  It always exits 0: a failing
epilog would make Slurm drain the node, and a missing engine or Docker SDK (a node that runs
``runtime = "local"`` cells only) means there is nothing to remove.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from matrun.runner.environments.engine import EngineUnavailable, connect

JOB_LABEL = "matrun.slurm_job"
CLUSTER_LABEL = "matrun.slurm_cluster"
SYSTEM_SOCKET = "unix:///var/run/docker.sock"
ENGINE_TIMEOUT_S = 10.0


def engine_urls(environ: Mapping[str, str]) -> list[str]:
    """The engines to ask, in order, without duplicates: DOCKER_HOST, the system socket, the
    job user's rootless socket."""
    urls = [environ.get("DOCKER_HOST") or "", SYSTEM_SOCKET]
    uid = environ.get("SLURM_JOB_UID") or ""
    if uid.isdigit():
        urls.append(f"unix:///run/user/{int(uid)}/docker.sock")
    out: list[str] = []
    for url in urls:
        if url and url not in out:
            out.append(url)
    return out


def remove_job_containers(job_id: str, urls: list[str], *, cluster: str = "", log=print) -> int:
    """Remove every container labelled with Slurm job ``job_id`` (of ``cluster``, when both it and
    the container name one) on the engines at ``urls``; return how many were removed.  Engines
    that do not answer are skipped."""
    removed = 0
    for url in urls:
        try:
            client = connect(url, timeout=ENGINE_TIMEOUT_S)
        except EngineUnavailable:
            continue
        try:
            for container in client.containers.list(all=True, filters={"label": f"{JOB_LABEL}={job_id}"}):
                labels = container.labels or {}
                if cluster and labels.get(CLUSTER_LABEL, cluster) != cluster:
                    continue  # the same job id in another cluster
                container.remove(force=True)
                removed += 1
                log(f"matrun-slurm-epilog: job {job_id}: removed container {container.short_id} "
                    f"(sweep {labels.get('matrun.sweep', '?')}, cell {labels.get('matrun.cell', '?')}, "
                    f"run {labels.get('matrun.run', '?')}) at {url}")
        except Exception as exc:  # the engine went away, a removal failed: try the others
            log(f"matrun-slurm-epilog: job {job_id}: {url}: {exc}")
        finally:
            client.close()
    return removed


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    job_id = (environ.get("SLURM_JOB_ID") or "").strip()
    if not job_id.isdigit():  # not run by slurmd as an epilog: say so, and still do no harm
        print("matrun-slurm-epilog: SLURM_JOB_ID is not set to a job id; nothing to do "
              "(Slurm runs this as the nodes' Epilog)", file=sys.stderr)
        return 0
    try:
        remove_job_containers(job_id, engine_urls(environ), cluster=environ.get("SLURM_CLUSTER_NAME") or "",
                              log=lambda m: print(m, file=sys.stderr))
    except Exception as exc:  # never fail the epilog: Slurm would drain the node
        print(f"matrun-slurm-epilog: job {job_id}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
