"""Multi-worker cells on one host: the launch plan every executor hands the in-cell launcher.

A cell with ``workers`` > 1 (or an MXNet ``dist_*`` kvstore) runs as several processes of the
same environment: the executor starts the harness as a *launcher*
(``python -m matrun.runner.harness --spec … --out RUN --launch RUN/workers.json``) — a
subprocess under the local executor, the command of the cell's ONE container under the docker
executor (containers have no network; loopback inside one container works) — and the launcher
starts the processes this plan lists (``runner/harness/launch.py``).

``worker_plan`` is pure: given the ports, it says exactly which process gets which role, rank,
CPUs and environment variables (tests/test_workers.py checks them one by one).  The split
rules (CPUs, threads, batches) are the harness's own (``runner/harness/distributed.py``), so the
host and the workers cannot disagree.  Every address is 127.0.0.1; ``pick_ports`` finds free
loopback ports.  docs/HARNESS.md "Multi-worker cells" and docs/EXECUTORS.md.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Mapping

from matrun.runner.frameworks import get_framework
from matrun.runner.harness import distributed as dist
from matrun.runner.harness.distributed import (  # noqa: F401  (re-exported for the executors)
    LOOPBACK, PLAN_FILE, WORKERS_DIR, multi_process, split_cpus, thread_share, world_size,
)
from matrun.runner.params import cpuset_cpus

PLAN_SCHEMA = 1
MXNET_SERVERS = 1  # parameter-server processes of an MXNet dist kvstore cell (one host)
# Frameworks whose servers listen on every interface: on the local executor their workers must
# run in a private network namespace (the launcher makes one), else the cell fails.
BINDS_EVERY_INTERFACE = {"tensorflow": "TensorFlow's gRPC servers listen on 0.0.0.0"}


def ports_needed(params: Mapping[str, Any]) -> int:
    """Loopback ports the cell's processes listen on: torch one (the TCP store), TensorFlow one
    per worker (TF_CONFIG), MXNet dist one for the scheduler and one per server and worker."""
    if not multi_process(params):
        return 0
    framework, local = params["framework"], int(params.get("workers") or 1)
    if framework == "tensorflow":
        return local
    if framework == "mxnet":
        return 1 + MXNET_SERVERS + local if dist.dist_kvstore(params) else 0
    return 1


def pick_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now (the kernel's choice of ephemeral
    ports, bound on the loopback address only and released)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def worker_plan(params: Mapping[str, Any], *, run_dir: Path, ports: list[int], network: str,
                node_rank: int = 0, master_addr: str = LOOPBACK) -> dict[str, Any]:
    """The launcher's plan for one host (``node_rank``) of the cell (pure).

    ``network``: ``"private"`` (local executor: the launcher makes a network namespace with
    only loopback, required for frameworks in ``BINDS_EVERY_INTERFACE``) or ``"inherit"``
    (docker: the container has no network already).  ``master_addr``: where rank 0's
    rendezvous listens (127.0.0.1 on one host; a multi-node launcher passes node 0's address).
    """
    if len(ports) < ports_needed(params):
        raise ValueError(f"the cell needs {ports_needed(params)} ports, got {len(ports)}")
    framework = params["framework"]
    fw = get_framework(framework)
    local = int(params.get("workers") or 1)
    world = world_size(params)
    run_dir = Path(run_dir).absolute()
    shares = split_cpus(sorted(cpuset_cpus(params.get("cpuset") or "")), local)
    processes: list[dict[str, Any]] = []
    ps_env: dict[str, str] = {}
    if dist.dist_kvstore(params):
        scheduler_port, server_ports, worker_ports = ports[0], ports[1:1 + MXNET_SERVERS], ports[1 + MXNET_SERVERS:]
        ps_env = {"DMLC_PS_ROOT_URI": master_addr, "DMLC_PS_ROOT_PORT": str(scheduler_port),
                  "DMLC_NUM_SERVER": str(MXNET_SERVERS), "DMLC_NUM_WORKER": str(world),
                  "DMLC_NODE_HOST": master_addr, "DMLC_INTERFACE": "lo"}
        if node_rank == 0:
            processes.append(_ps_process("scheduler", 0, run_dir, {**ps_env, "DMLC_ROLE": "scheduler"}))
        for i, port in enumerate(server_ports):
            processes.append(_ps_process("server", i, run_dir, {**ps_env, "DMLC_ROLE": "server", "PORT": str(port),
                                                                   # a server only sums and updates
                                                                   "OMP_NUM_THREADS": "1"}))
    for local_rank in range(local):
        rank = node_rank * local + local_rank
        env = {
            dist.ENV_ROLE: "worker", dist.ENV_RANK: str(rank), dist.ENV_WORLD: str(world),
            dist.ENV_LOCAL_RANK: str(local_rank), dist.ENV_LOCAL_WORLD: str(local),
            dist.ENV_NODE_RANK: str(node_rank), dist.ENV_BUNDLE: str(run_dir),
        }
        wp = dist.worker_params(params, local_rank)
        if wp["threads"] != dist.UNSET:
            env.update({v: str(wp["threads"]) for v in fw.thread_vars})
        if wp["interop_threads"] != dist.UNSET:
            env.update({v: str(wp["interop_threads"]) for v in fw.interop_vars})
        if params["device"] == "gpu":  # one GPU per worker: its own is cuda:0 inside
            env["CUDA_VISIBLE_DEVICES"] = str(local_rank)
        env.update(_framework_env(params, rank=rank, local_rank=local_rank, world=world, ports=ports,
                                  master_addr=master_addr, ps_env=ps_env))
        processes.append({
            "role": "worker", "rank": rank, "local_rank": local_rank,
            "cpus": shares[local_rank],
            "out": str(run_dir if rank == 0 else run_dir / WORKERS_DIR / f"worker-{rank}"),
            "env": env,
        })
    plan = {"schema_version": PLAN_SCHEMA, "framework": framework, "world_size": world, "workers": local,
            "node_rank": node_rank, "network": network, "processes": processes}
    if network == "private" and framework in BINDS_EVERY_INTERFACE:
        plan["network"] = "private-required"
        plan["network_reason"] = BINDS_EVERY_INTERFACE[framework]
    return plan


def _ps_process(role: str, index: int, run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    return {"role": role, "rank": index, "local_rank": index, "cpus": [],
            "out": str(run_dir / WORKERS_DIR / f"{role}-{index}"), "env": env}


def _framework_env(params: Mapping[str, Any], *, rank: int, local_rank: int, world: int, ports: list[int],
                   master_addr: str, ps_env: Mapping[str, str]) -> dict[str, str]:
    framework = params["framework"]
    local = int(params.get("workers") or 1)
    if framework == "torch":
        return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(local), "MASTER_ADDR": master_addr, "MASTER_PORT": str(ports[0]),
                # gloo / NCCL bind their pairs to this interface's address (loopback)
                "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    if framework == "tensorflow":
        cluster = {"worker": [f"{master_addr}:{port}" for port in ports[:world]]}
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}},
                                        separators=(",", ":"))}
    if framework == "mxnet" and ps_env:
        return {**ps_env, "DMLC_ROLE": "worker", "PORT": str(ports[1 + MXNET_SERVERS + local_rank])}
    return {}


def write_plan(run_dir: Path, params: Mapping[str, Any], *, network: str) -> Path | None:
    """Pick the ports, write ``<run>/workers.json``; None for a single-process cell."""
    if not multi_process(params):
        return None
    plan = worker_plan(params, run_dir=run_dir, ports=pick_ports(ports_needed(params)), network=network)
    path = Path(run_dir) / PLAN_FILE
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    return path


def host_refusal(params: Mapping[str, Any], executor: str) -> str | None:
    """Why a one-host executor (local, docker) cannot run this cell, or None: ``nodes`` > 1
    (no executor places one cell's workers on several hosts yet; the slurm executor refuses
    it too)."""
    nodes = int(params.get("nodes") or 1)
    if nodes > 1:
        return (f"nodes = {nodes}: the {executor} executor runs a cell on one host, and no executor runs "
                "multi-node cells yet (slurm runs each cell on one node); use nodes = 1 and workers")
    return None
