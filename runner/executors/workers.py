"""Multi-worker cells on one host: the launch plan every executor hands the in-cell launcher.

A cell with ``workers`` > 1 (or a ``dist_*`` kvstore) runs as several processes of the
same environment: the executor starts the harness as a *launcher*
(``python -m matrun.runner.harness --spec … --out RUN --launch RUN/workers.json``) — a
subprocess under the local executor, the command of the cell's ONE container under the docker
executor (containers have no network; loopback inside one container works) — and the launcher
starts the processes this plan lists (``runner/harness/launch.py``).

``worker_plan`` is pure: given the ports, it says exactly which process gets which role, rank,
CPUs and environment variables (tests/test_workers.py checks them one by one).  The split
rules (CPUs, threads, batches) are the harness's own (``runner/harness/distributed.py``), so the
host and the workers cannot disagree.  How a framework's processes find each other (their
ports, their variables, parameter servers) is data: ``[workers]`` of its framework.toml
(``matrun.frameworks.Workers``, docs/FRAMEWORKS.md).  Every address is 127.0.0.1;
``pick_ports`` finds free loopback ports.  docs/HARNESS.md "Multi-worker cells" and
docs/EXECUTORS.md.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from matrun.frameworks import Workers, get_framework
from matrun.runner.environments.system import executor_refusal
from matrun.runner.harness import distributed as dist
from matrun.runner.harness.distributed import (  # noqa: F401  (re-exported for the executors)
    LOOPBACK, PLAN_FILE, WORKERS_DIR, multi_process, split_cpus, thread_share, world_size,
)
from matrun.runner.harness.cpusets import parse_cpuset as cpuset_cpus

PLAN_SCHEMA = 1


def _rendezvous(params: Mapping[str, Any]) -> Workers | None:
    """The framework's ``[workers]`` description when the cell's processes use it: a
    multi-process cell, and for a framework with parameter servers a ``dist_*`` kvstore."""
    if not multi_process(params):
        return None
    workers = get_framework(params["framework"]).workers
    if workers.parameter_servers and not dist.dist_kvstore(params):
        return None
    return workers


def ports_needed(params: Mapping[str, Any]) -> int:
    """Ports each host of the cell listens on, as ``[workers] ports`` lists them: e.g. one for
    a rendezvous store, one per worker, or a scheduler's, one per server and one per worker."""
    workers = _rendezvous(params)
    return workers.ports_needed(int(params.get("workers") or 1)) if workers else 0


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
    only loopback, required for a framework whose servers bind every interface) or ``"inherit"``
    (docker: the container has no network already; a node of a multi-node cell: the host's).
    One host: ``ports`` are this host's and every address is ``master_addr`` (127.0.0.1).
    A multi-node cell: ``peers`` is every node's ``{"addr", "iface", "ports"}`` in node order
    (``exchange_peers``); node 0 holds the rendezvous (a store, or a scheduler and the
    parameter servers), each node's workers listen on its own ports and address.
    """
    if peers is None:
        peers = [{"addr": master_addr, "iface": "lo", "ports": list(ports)}]
    if len(peers) != int(params.get("nodes") or 1) or not 0 <= node_rank < len(peers):
        raise ValueError(f"node {node_rank} of a cell with {params.get('nodes') or 1} node(s) got "
                         f"{len(peers)} peer record(s)")
    for peer in peers:
        if len(peer["ports"]) < ports_needed(params):
            raise ValueError(f"the cell needs {ports_needed(params)} ports per node, got {len(peer['ports'])}")
    me = peers[node_rank]
    framework = params["framework"]
    fw = get_framework(framework)
    local = int(params.get("workers") or 1)
    world = world_size(params)
    run_dir = Path(run_dir).absolute()
    shares = split_cpus(sorted(cpuset_cpus(params.get("cpuset") or "")), local)
    processes: list[dict[str, Any]] = []
    rdv = _rendezvous(params)
    values = _host_values(rdv, peers, node_rank, local, world) if rdv else {}
    if rdv and rdv.parameter_servers and node_rank == 0:  # the scheduler and the servers: node 0 only
        port = rdv.port(me["ports"], "rendezvous", 0, local)
        processes.append(_ps_process("scheduler", 0, run_dir, rdv.server_code, rdv.environment(
            "scheduler", {**values, "rank": 0, "local_rank": 0, "port": port})))
        for i in range(rdv.parameter_servers):
            port = rdv.port(me["ports"], "servers", i, local)
            processes.append(_ps_process("server", i, run_dir, rdv.server_code, rdv.environment(
                "server", {**values, "rank": i, "local_rank": i, "port": port})))
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
        if rdv:
            port = rdv.port(me["ports"], "workers", local_rank, local)
            env.update(rdv.environment("worker", {**values, "rank": rank, "local_rank": local_rank,
                                                  "port": port}))
        processes.append({
            "role": "worker", "rank": rank, "local_rank": local_rank,
            "cpus": shares[local_rank],
            "out": str(run_dir if rank == 0 else run_dir / WORKERS_DIR / f"worker-{rank}"),
            "env": env,
        })
    plan = {"schema_version": PLAN_SCHEMA, "framework": framework, "world_size": world, "workers": local,
            "node_rank": node_rank, "network": network, "processes": processes}
    if network == "private" and fw.workers.binds_every_interface:
        plan["network"] = "private-required"
        plan["network_reason"] = fw.workers.binds_every_interface
    return plan


def _host_values(workers: Workers, peers: Sequence[Mapping[str, Any]], node_rank: int, local: int,
                 world: int) -> dict[str, Any]:
    """What the ``[workers.env]`` templates of one host's processes may name
    (``matrun.frameworks.PLACEHOLDERS``), but for the process's own rank and port."""
    me, head = peers[node_rank], peers[0]
    values: dict[str, Any] = {
        "world": world, "local_world": local, "node_rank": node_rank, "addr": me["addr"],
        "iface": me["iface"], "rendezvous_addr": head["addr"], "servers": workers.parameter_servers,
        "rendezvous_port": workers.port(head["ports"], "rendezvous", 0, local),
    }
    if "workers" in workers.ports:
        values["worker_addresses"] = [f"{peer['addr']}:{workers.port(peer['ports'], 'workers', i, local)}"
                                      for peer in peers for i in range(local)]
    return values


def _ps_process(role: str, index: int, run_dir: Path, code: str, env: dict[str, str]) -> dict[str, Any]:
    # ``code``: the framework's own server program (framework.toml [workers] server_code)
    return {"role": role, "rank": index, "local_rank": index, "cpus": [], "code": code,
            "out": str(run_dir / WORKERS_DIR / f"{role}-{index}"), "env": env}


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
    needs the slurm executor with its local runtime, which places the nodes' workers; a
    ``variant = "system"`` cell (the site's own Python) needs the local executor."""
    nodes = int(params.get("nodes") or 1)
    if nodes > 1:
        return (f"nodes = {nodes}: the {executor} executor runs a cell on one host; multi-node cells run "
                'with --executor slurm and runtime = "local" in [slurm]')
    return executor_refusal(params, executor)  # the site's own Python: the local executor only
