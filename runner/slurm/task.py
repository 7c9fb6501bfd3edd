"""One task of a matrun Slurm job array: ``python -m matrun.runner.slurm.task TASKS_JSON``.

Started by the constant batch script of ``runner/slurm/executor.py`` on the node Slurm chose.
``SLURM_ARRAY_TASK_ID`` picks the run in ``tasks.json``; the run directory already holds the
``spec.json`` the sweep wrote.  The task records itself (``slurm.json``: job, node, host, start),
runs the cell with the docker executor exactly as ``matrun sweep --executor docker`` would, and
writes ``result.json`` last (executor ``slurm``).  It exits 0 for an ok run, 1 otherwise, so
Slurm's own state (COMPLETED / FAILED) agrees with the run.

With ``[slurm] runtime = "local"`` (``tasks.json``'s ``runtime``) the local executor runs the cell
instead, in matrun's environments.  A multi-node cell's task runs on each of its nodes (srun):
``SLURM_NODEID`` is the node's rank; the nodes meet in the run directory (``rendezvous/``,
``runner/executors/workers.py: exchange_peers``), each runs its own workers with the local
executor, node 0 writes ``result.json`` and node k its records under ``nodes/node-<k>/``.

The container is not a child of the task: Slurm's process tracking cannot see it.  So the task
traps SIGTERM and SIGINT (scancel, the time limit, a node shutdown): the docker executor
removes the container, any container of this run the engine still holds is removed too (one
created in the instant the signal came), and the task exits 143 without a result.  The sweep
then writes the run's result from Slurm's state (cancelled, timeout, …).  A SIGKILL cannot be
trapped: the container carries the labels ``matrun.slurm_job=<SLURM_JOB_ID>`` and
``matrun.slurm_cluster``, and the nodes'
Epilog (``runner/slurm/epilog.py``) removes it when Slurm ends the job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from matrun.runner.environments.engine import connect
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.protocol import RunOutcome, RunRequest
from matrun.runner.executors.workers import NODES_DIR, exchange_peers, write_node_plan
from matrun.runner.slurm.executor import task_params
from matrun.runner.slurm.jobs import TASK_RECORD
from matrun.runner.slurm.state import node_address
from matrun.runner.sweep.records import host_info, with_state, write_result
from matrun.warehouse.bundles.layout import SPEC, STDERR, STDOUT, RunKey
from matrun.warehouse.bundles.write import write_json_atomic

NODE_RECORD = "node.json"  # nodes/node-<k>/node.json: how node k > 0's part of a multi-node cell ended
RENDEZVOUS_TIMEOUT_S = 300.0  # at most this long for every node of a multi-node cell to arrive


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived: stop the cell, record nothing."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: Any) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):  # once is enough: let the clean-up finish
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except Stopped as stop:  # before the run was recorded: nothing ran
        return 128 + stop.signum


def _main(args: list[str]) -> int:
    if len(args) != 1 or "SLURM_ARRAY_TASK_ID" not in os.environ:
        print("usage: SLURM_ARRAY_TASK_ID=N python -m matrun.runner.slurm.task TASKS_JSON "
              "(started by matrun's Slurm batch script)", file=sys.stderr)
        return 2
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    tasks = json.loads(Path(args[0]).read_text())
    entry = tasks["tasks"][index]
    run_dir = Path(entry["run_dir"])
    spec = json.loads((run_dir / SPEC).read_text())
    key = RunKey(spec["sweep"], spec["cell_id"], int(spec["repeat"]), int(spec["attempt"]))
    if (key.cell_id, key.repeat, key.attempt) != (entry["cell_id"], int(entry["repeat"]), int(entry["attempt"])):
        print(f"{run_dir}: spec.json does not match tasks.json entry {index}", file=sys.stderr)
        return 2

    runtime = str(tasks.get("runtime") or "docker")
    nodes = int(spec["params"].get("nodes") or 1)
    node_rank = int(os.environ.get("SLURM_NODEID") or 0) if nodes > 1 else 0
    # node 0 is the run's own record; node k > 0 of a multi-node cell keeps its own under nodes/
    node_dir = run_dir if node_rank == 0 else run_dir / NODES_DIR / f"node-{node_rank}"
    node_dir.mkdir(parents=True, exist_ok=True)
    host = host_info()
    record = {
        "schema_version": 1, "job_id": os.environ.get("SLURM_JOB_ID"),
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"), "array_task_id": index,
        "node": os.environ.get("SLURMD_NODENAME"), "gpus": os.environ.get("SLURM_JOB_GPUS"),
        "runtime": runtime, "node_rank": node_rank, "nodes": nodes,
        "started_at": datetime.now(timezone.utc).isoformat(), "started_unix": time.time(),
        "process_started_unix": _process_start(), "pid": os.getpid(), "host": host,
    }
    write_json_atomic(node_dir / TASK_RECORD, record)
    try:
        return _run(run_dir, spec, key, with_state(host, spec["params"]), runtime=runtime, node_rank=node_rank,
                    node_dir=node_dir)
    except Stopped as stop:
        _remove_leftovers(key)
        record.update(stopped_at=datetime.now(timezone.utc).isoformat(), signal=signal.Signals(stop.signum).name)
        write_json_atomic(node_dir / TASK_RECORD, record)
        print(f"[matrun] {signal.Signals(stop.signum).name}: the cell was stopped; Slurm's state "
              "decides the run's status", file=sys.stderr)
        return 128 + stop.signum


def _run(run_dir: Path, spec: dict[str, Any], key: RunKey, host: dict[str, Any], *, runtime: str = "docker",
         node_rank: int = 0, node_dir: Path | None = None) -> int:
    """Run the cell (or, for node k > 0 of a multi-node cell, this node's workers of it) with
    the runtime's executor.  Node 0 writes the run's ``result.json``; node k > 0 its ``node.json``."""
    node_dir = node_dir or run_dir
    params = task_params(spec["params"], os.environ)
    timeout = float(spec["params"]["timeout"])
    started = datetime.now(timezone.utc).isoformat()
    t0 = time.monotonic()
    try:
        plan = _place(run_dir, params, node_rank, timeout=timeout) if int(params.get("nodes") or 1) > 1 else None
        request = RunRequest(run_dir=run_dir, params=params, env_id=spec["env_id"], timeout=timeout,
                             data_dir=Path(spec["data_dir"]), plan=plan,
                             log_dir=node_dir if node_rank > 0 else None)
        if runtime == "local":
            outcome = LocalExecutor().run(request)
        else:
            # labelled with this task's job id: if Slurm SIGKILLs the task, its epilog
            # (runner/slurm/epilog.py) removes the container the task could not
            outcome = DockerExecutor(slurm_job=os.environ.get("SLURM_JOB_ID", ""),
                                     slurm_cluster=os.environ.get("SLURM_CLUSTER_NAME", "")).run(request)
    except Exception as exc:  # no engine on this node, no image built from the recipe, no rendezvous, …
        outcome = RunOutcome(status="failed", exit_code=None,
                             error_tail=f"[matrun] the Slurm task could not run the cell on "
                                        f"{host.get('hostname')}: {exc}",
                             started_at=started, ended_at=datetime.now(timezone.utc).isoformat(),
                             wall_seconds=round(time.monotonic() - t0, 3))
        for name in (STDOUT, STDERR):
            (node_dir / name).touch()
    if node_rank > 0:
        record = asdict(outcome)
        del record["image"]  # a node k > 0 runs the local runtime: no image (and node.json never had one)
        write_json_atomic(node_dir / NODE_RECORD, {"schema_version": 1, "node_rank": node_rank, "host": host,
                                                   **record})
    else:
        write_result(key, run_dir, spec["env_id"], "slurm", host, outcome)
    return 0 if outcome.status == "ok" else 1


def _place(run_dir: Path, params: dict[str, Any], node_rank: int, *, timeout: float) -> Path:
    """This node's launch plan of a multi-node cell: Slurm gave the task as many nodes as the
    cell asks for; every node publishes its address and ports in the shared run directory
    (``exchange_peers``) and plans its own workers against all of them."""
    nodes = int(params.get("nodes") or 1)
    granted = int(os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    if granted != nodes or "SLURM_NODEID" not in os.environ:
        raise RuntimeError(f"the cell asks for {nodes} nodes, the task runs on {granted} "
                           f"(SLURM_NODEID {'set' if 'SLURM_NODEID' in os.environ else 'unset'}): "
                           "it must be started by srun, one task per node")
    name = os.environ.get("SLURMD_NODENAME") or ""
    peers = exchange_peers(run_dir, params, node_rank=node_rank, addr=node_address(name),
                           timeout=min(RENDEZVOUS_TIMEOUT_S, timeout))
    return write_node_plan(run_dir, params, peers, node_rank)


def _process_start() -> float | None:
    """When Slurm started the batch script (this process, before its exec of Python): its start
    in clock ticks since boot against the uptime now (psutil's create_time rounds the boot time
    to whole seconds)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _remove_leftovers(key: RunKey) -> None:
    """Remove any container of this run the engine still has (labels set at create)."""
    try:
        client = connect(timeout=10)
        labels = [f"matrun.sweep={key.sweep}", f"matrun.cell={key.cell_id}",
                  f"matrun.run={key.repeat}-{key.attempt}"]
        for container in client.containers.list(all=True, filters={"label": labels}):
            container.remove(force=True)
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main())
