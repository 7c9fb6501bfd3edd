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
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from matrun.frameworks import get_framework
from matrun.runner.harness import distributed as dist
from matrun.runner.harness.distributed import (  # noqa: F401  (re-exported for the executors)
    LOOPBACK, PLAN_FILE, WORKERS_DIR, multi_process, split_cpus, thread_share, world_size,
)
from matrun.runner.planning.params import cpuset_cpus

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
                node_rank: int = 0, master_addr: str = LOOPBACK,
                peers: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The launcher's plan for one host (``node_rank``) of the cell (pure).

    ``network``: ``"private"`` (local executor: the launcher makes a network namespace with
    only loopback, required for frameworks in ``BINDS_EVERY_INTERFACE``) or ``"inherit"``
    (docker: the container has no network already; a node of a multi-node cell: the host's).
    One host: ``ports`` are this host's and every address is ``master_addr`` (127.0.0.1).
    A multi-node cell: ``peers`` is every node's ``{"addr", "iface", "ports"}`` in node order
    (``exchange_peers``); node 0 holds the rendezvous (torch's store, MXNet's scheduler and
    server), each node's workers listen on its own ports and address.
    """
    if peers is None:
        peers = [{"addr": master_addr, "iface": "lo", "ports": list(ports)}]
    if len(peers) != int(params.get("nodes") or 1) or not 0 <= node_rank < len(peers):
        raise ValueError(f"node {node_rank} of a cell with {params.get('nodes') or 1} node(s) got "
                         f"{len(peers)} peer record(s)")
    for peer in peers:
        if len(peer["ports"]) < ports_needed(params):
            raise ValueError(f"the cell needs {ports_needed(params)} ports per node, got {len(peer['ports'])}")
    me, head = peers[node_rank], peers[0]
    framework = params["framework"]
    fw = get_framework(framework)
    local = int(params.get("workers") or 1)
    world = world_size(params)
    run_dir = Path(run_dir).absolute()
    shares = split_cpus(sorted(cpuset_cpus(params.get("cpuset") or "")), local)
    processes: list[dict[str, Any]] = []
    ps_env: dict[str, str] = {}
    if dist.dist_kvstore(params):
        ps_env = {"DMLC_PS_ROOT_URI": head["addr"], "DMLC_PS_ROOT_PORT": str(head["ports"][0]),
                  "DMLC_NUM_SERVER": str(MXNET_SERVERS), "DMLC_NUM_WORKER": str(world),
                  "DMLC_NODE_HOST": me["addr"], "DMLC_INTERFACE": me["iface"]}
        if node_rank == 0:  # the scheduler and the servers run on node 0 only
            processes.append(_ps_process("scheduler", 0, run_dir, {**ps_env, "DMLC_ROLE": "scheduler"}))
            for i, port in enumerate(me["ports"][1:1 + MXNET_SERVERS]):
                processes.append(_ps_process("server", i, run_dir, {**ps_env, "DMLC_ROLE": "server",
                                                                       "PORT": str(port),
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
        env.update(_framework_env(params, rank=rank, local_rank=local_rank, world=world, peers=peers,
                                  me=me, ps_env=ps_env))
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


def _framework_env(params: Mapping[str, Any], *, rank: int, local_rank: int, world: int,
                   peers: Sequence[Mapping[str, Any]], me: Mapping[str, Any],
                   ps_env: Mapping[str, str]) -> dict[str, str]:
    framework = params["framework"]
    local = int(params.get("workers") or 1)
    if framework == "torch":
        return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(local), "MASTER_ADDR": peers[0]["addr"],
                "MASTER_PORT": str(peers[0]["ports"][0]),
                # gloo / NCCL bind their pairs to this interface's address (loopback on one host)
                "GLOO_SOCKET_IFNAME": me["iface"], "NCCL_SOCKET_IFNAME": me["iface"]}
    if framework == "tensorflow":
        cluster = {"worker": [f"{peer['addr']}:{port}" for peer in peers for port in peer["ports"][:local]]}
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}},
                                        separators=(",", ":"))}
    if framework == "mxnet" and ps_env:
        return {**ps_env, "DMLC_ROLE": "worker", "PORT": str(me["ports"][1 + MXNET_SERVERS + local_rank])}
    return {}


def write_plan(run_dir: Path, params: Mapping[str, Any], *, network: str) -> Path | None:
    """Pick the ports, write ``<run>/workers.json``; None for a single-process cell."""
    if not multi_process(params):
        return None
    plan = worker_plan(params, run_dir=run_dir, ports=pick_ports(ports_needed(params)), network=network)
    path = Path(run_dir) / PLAN_FILE
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    return path


RENDEZVOUS_DIR = "rendezvous"  # <run>/rendezvous/node-<k>.json: each node's address and ports
NODES_DIR = "nodes"            # <run>/nodes/node-<k>/: a node k > 0's launcher logs, monitor, record


def node_plan_file(run_dir: Path, node_rank: int) -> Path:
    """Node 0's plan is ``<run>/workers.json`` (as on one host); node k's ``workers-node-<k>.json``."""
    return Path(run_dir) / (PLAN_FILE if node_rank == 0 else f"workers-node-{node_rank}.json")


def interface_of(addr: str) -> str:
    """The name of this host's network interface that holds ``addr`` (``lo`` for 127.0.0.1):
    gloo, NCCL and MXNet bind to it.  ValueError when no interface has that address."""
    import fcntl
    import struct

    if addr.startswith("127."):
        return "lo"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == addr:
                return name
    raise ValueError(f"no network interface of this host has the address {addr}")


def exchange_peers(run_dir: Path, params: Mapping[str, Any], *, node_rank: int, addr: str, timeout: float,
                   poll: float = 0.2, alive: Any = None) -> list[dict[str, Any]]:
    """A multi-node cell's rendezvous through the shared run directory: this node picks the
    ports it needs, writes ``rendezvous/node-<k>.json`` (address, interface, ports, host name)
    and waits until every node has written its own; returns them in node order.  TimeoutError
    names the nodes that did not come within ``timeout`` (``alive()`` False stops the wait too)."""
    nodes = int(params.get("nodes") or 1)
    directory = Path(run_dir) / RENDEZVOUS_DIR
    directory.mkdir(exist_ok=True)
    me = {"node_rank": node_rank, "addr": addr, "iface": interface_of(addr),
          "ports": pick_ports(ports_needed(params)), "host": socket.gethostname()}
    path = directory / f"node-{node_rank}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(me), encoding="utf-8")
    tmp.replace(path)
    deadline = time.monotonic() + timeout
    peers: dict[int, dict[str, Any]] = {}
    while True:
        for k in range(nodes):
            if k not in peers:
                try:
                    peers[k] = json.loads((directory / f"node-{k}.json").read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    pass
        if len(peers) == nodes:
            return [peers[k] for k in range(nodes)]
        if time.monotonic() > deadline or (alive is not None and not alive()):
            missing = ", ".join(str(k) for k in range(nodes) if k not in peers)
            raise TimeoutError(f"node(s) {missing} of the cell did not reach the rendezvous in {directory} "
                               f"within {timeout:g} s")
        time.sleep(poll)


def write_node_plan(run_dir: Path, params: Mapping[str, Any], peers: Sequence[Mapping[str, Any]],
                    node_rank: int) -> Path:
    """Write node ``node_rank``'s plan of a multi-node cell (the host's network: ``inherit``)."""
    plan = worker_plan(params, run_dir=run_dir, ports=[], network="inherit", node_rank=node_rank, peers=peers)
    path = node_plan_file(run_dir, node_rank)
    path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
    return path


def host_refusal(params: Mapping[str, Any], executor: str) -> str | None:
    """Why a one-host executor (local, docker) cannot run this cell, or None: ``nodes`` > 1
    needs the slurm executor with its local runtime, which places the nodes' workers."""
    nodes = int(params.get("nodes") or 1)
    if nodes > 1:
        return (f"nodes = {nodes}: the {executor} executor runs a cell on one host; multi-node cells run "
                'with --executor slurm and runtime = "local" in [slurm]')
    return None
