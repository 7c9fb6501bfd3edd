"""Multi-worker cells: who this process is, and how the cell's batch, CPUs and threads are split.

Standard library only: the host imports the same rules (``runner/executors/workers.py`` builds
each process's environment with them) so that what the host plans and what a worker applies
can never disagree.  docs/HARNESS.md "Multi-worker cells" is the prose version.

A cell with ``workers`` × ``nodes`` > 1 (or an MXNet ``dist_*`` kvstore) runs as several
processes started by the in-cell launcher (``launch.py``).  Each worker process learns its
place from ``MATRUN_*`` variables (``context``):

- rank 0 writes the bundle's ``events.jsonl`` (its ``--out`` is the run directory); rank r > 0
  writes its own full event log under ``<run>/workers/worker-<r>/``;
- every worker shuffles the whole training set with the same seed, cuts it into the same
  *global* batches (``batch_size`` per worker with ``scaling = "weak"``, ``batch_size`` in
  all with ``"strong"``) and trains on every ``world``-th sample of each, starting at its
  rank (``local_count``);
- at the end each rank r > 0 writes ``worker.json`` (its throughput, step time, affinity,
  threads, gradient-exchange time) and rank 0 gathers them into its summary.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .cpusets import format_cpuset, parse_cpuset
from .spec import UNSET

DIST_KVSTORES = ("dist_sync", "dist_async")  # the kvstores with a parameter server
LOOPBACK = "127.0.0.1"

PLAN_FILE = "workers.json"      # the launcher's plan, written by the host into the run directory
WORKERS_DIR = "workers"         # <run>/workers/<role>-<rank>/: everything but rank 0
REPORT_FILE = "worker.json"     # what a rank r > 0 tells rank 0 at the end

ENV_ROLE = "MATRUN_ROLE"              # worker | server | scheduler
ENV_RANK = "MATRUN_RANK"              # global rank of a worker, from 0
ENV_WORLD = "MATRUN_WORLD_SIZE"       # workers in the whole cell (workers × nodes)
ENV_LOCAL_RANK = "MATRUN_LOCAL_RANK"  # rank among the workers of this host
ENV_LOCAL_WORLD = "MATRUN_LOCAL_WORLD_SIZE"
ENV_NODE_RANK = "MATRUN_NODE_RANK"
ENV_BUNDLE = "MATRUN_BUNDLE"          # the run directory (rank 0's output; worker dirs below it)
MATRUN_ENV = (ENV_ROLE, ENV_RANK, ENV_WORLD, ENV_LOCAL_RANK, ENV_LOCAL_WORLD, ENV_NODE_RANK, ENV_BUNDLE)
# Variables of the frameworks' own rendezvous: removed from a single-process child (the oneDNN check).
RENDEZVOUS_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "TF_CONFIG", "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                  "DMLC_NUM_WORKER", "DMLC_NODE_HOST", "DMLC_INTERFACE", "PORT")

GATHER_TIMEOUT_S = 300.0


# --- the split rules (pure) ------------------------------------------------------------------


def world_size(params: Mapping[str, Any]) -> int:
    """Worker processes of the whole cell: ``workers`` × ``nodes`` (each 1 when absent or null)."""
    return int(params.get("workers") or 1) * int(params.get("nodes") or 1)


def dist_kvstore(params: Mapping[str, Any]) -> bool:
    """A cell with a parameter server (scheduler and server processes of its own): the host
    leaves ``kvstore`` null for frameworks without one (framework.toml ``[workers]``)."""
    return params.get("kvstore") in DIST_KVSTORES


def multi_process(params: Mapping[str, Any]) -> bool:
    """Whether the cell runs as several processes (through the launcher)."""
    return world_size(params) > 1 or dist_kvstore(params)


def synchronous(params: Mapping[str, Any]) -> bool:
    """Every step waits for every worker (all but MXNet's ``dist_async``)."""
    return params.get("kvstore") != "dist_async"


def split_cpus(cpus: Sequence[int], parts: int) -> list[list[int]]:
    """The CPUs of each of ``parts`` workers: contiguous shares of the sorted list whose sizes
    differ by at most one ([0, 1, 2] in 2 → [0, 1], [2]); with fewer CPUs than workers,
    worker i gets CPU i mod n alone (workers then share CPUs).  No CPUs: no shares."""
    cpus = sorted(cpus)
    if not cpus:
        return [[] for _ in range(parts)]
    if len(cpus) < parts:
        return [[cpus[i % len(cpus)]] for i in range(parts)]
    base, extra = divmod(len(cpus), parts)
    shares, at = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        shares.append(cpus[at:at + size])
        at += size
    return shares


def thread_share(value: Any, parts: int) -> Any:
    """A worker's share of the cell's thread count: ``value // parts``, at least 1; ``"unset"``
    stays unset (each worker gets the framework's default, as a single-process cell would)."""
    if value == UNSET or value is None:
        return value
    return max(1, int(value) // parts)


def worker_params(params: Mapping[str, Any], local_rank: int) -> dict[str, Any]:
    """The parameters one worker applies: its share of ``threads`` / ``interop_threads`` and of
    the ``cpuset`` (when the cell has one), the rest as the cell's."""
    local = int(params.get("workers") or 1)
    out = dict(params)
    if local > 1:
        out["threads"] = thread_share(params["threads"], local)
        out["interop_threads"] = thread_share(params["interop_threads"], local)
        if params.get("cpuset"):
            out["cpuset"] = format_cpuset(split_cpus(sorted(parse_cpuset(params["cpuset"])), local)[local_rank])
        if params.get("device") == "gpu":
            out["gpus"] = 1  # one GPU per worker (CUDA_VISIBLE_DEVICES names it)
    return out


def global_batch(params: Mapping[str, Any]) -> int:
    """Samples in one optimizer step of the whole cell: ``batch_size`` × world (weak scaling,
    ``batch_size`` is per worker) or ``batch_size`` (strong: split across the workers)."""
    if params.get("scaling") == "strong":
        return int(params["batch_size"])
    return int(params["batch_size"]) * world_size(params)


def local_count(global_count: int, rank: int, world: int) -> int:
    """Samples worker ``rank`` takes of a global batch of ``global_count``: every ``world``-th,
    from its rank (``batch[rank::world]``)."""
    return len(range(rank, global_count, world))


def batch_starts(samples: int, batch: int, world: int, budget: int | None) -> list[tuple[int, int]]:
    """(start, size) of the global batches of one pass over ``samples`` shuffled samples: at most
    ``budget`` of them; with several workers a last batch smaller than the number of workers is
    dropped (some worker would get no sample)."""
    stop = samples if budget is None else min(samples, budget * batch)
    out = []
    for start in range(0, stop, batch):
        size = min(batch, samples - start)
        if world > 1 and size < world:
            break
        out.append((start, size))
    return out


# --- this process --------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """This process's place in its cell (single-process cells: rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    node_rank: int = 0
    role: str = "worker"
    bundle: Path | None = None
    sync: bool = True

    @property
    def chief(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def recorded_images(self, global_count: int) -> int:
        """The ``images`` of a step record: rank 0 of a synchronous cell records the whole step
        (all workers' samples, so the summary's throughput is the aggregate); everyone else
        records its own samples."""
        if self.chief and self.sync:
            return global_count
        return local_count(global_count, self.rank, self.world)

    def worker_dir(self, rank: int) -> Path:
        assert self.bundle is not None
        return self.bundle / WORKERS_DIR / f"worker-{rank}"


def context(params: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Context:
    """This process's ``Context`` from the launcher's ``MATRUN_*`` variables (none: a
    single-process cell).  ValueError when they contradict the cell (a wrong launch)."""
    env = os.environ if environ is None else environ
    world = world_size(params)
    if ENV_RANK not in env:
        if world > 1:
            raise ValueError(f"the cell has {world} workers but this process was not started by the "
                             f"launcher ({ENV_RANK} is not set)")
        return Context(sync=synchronous(params))
    try:
        ctx = Context(rank=int(env[ENV_RANK]), world=int(env.get(ENV_WORLD, "1")),
                      local_rank=int(env.get(ENV_LOCAL_RANK, env[ENV_RANK])),
                      local_world=int(env.get(ENV_LOCAL_WORLD, "1")),
                      node_rank=int(env.get(ENV_NODE_RANK, "0")), role=env.get(ENV_ROLE, "worker"),
                      bundle=Path(env[ENV_BUNDLE]) if env.get(ENV_BUNDLE) else None,
                      sync=synchronous(params))
    except ValueError:
        raise ValueError(f"bad launcher variables: {ENV_RANK}={env.get(ENV_RANK)!r}, "
                         f"{ENV_WORLD}={env.get(ENV_WORLD)!r}") from None
    if ctx.world != world or not 0 <= ctx.rank < world:
        raise ValueError(f"the launcher started rank {ctx.rank} of {ctx.world}, but the cell has "
                         f"{world} workers")
    return ctx


_CURRENT = Context()


def set_current(ctx: Context) -> None:
    """Set by ``run_cell`` before the adapter runs (adapters read it with ``current()``)."""
    global _CURRENT
    _CURRENT = ctx


def current() -> Context:
    """This process's ``Context`` as ``run_cell`` found it (rank 0 of 1 outside a cell)."""
    return _CURRENT


def single_process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the launcher's and the frameworks' rendezvous variables (for a child
    that must run alone, such as the oneDNN check)."""
    return {k: v for k, v in environ.items() if k not in MATRUN_ENV and k not in RENDEZVOUS_ENV}


# --- what the workers tell rank 0 --------------------------------------------------------------


def step_stats(ctx: Context, steps: Sequence[tuple[int, float, float, int]], warmup: int) -> dict[str, Any]:
    """This worker's own numbers from its step records (timed steps; all if none are timed):
    median step seconds and its own images/s (``local`` samples, not the aggregate)."""
    timed = list(steps[warmup:]) or list(steps)
    own = []
    for _, t0, t1, images in timed:
        if ctx.chief and ctx.sync:  # rank 0 recorded the global count: take its own share back
            images = local_count(images, ctx.rank, ctx.world)
        own.append(images / max(t1 - t0, 1e-12))
    seconds = [t1 - t0 for _, t0, t1, _ in timed]
    return {"throughput": statistics.median(own) if own else None,
            "step_seconds_median": statistics.median(seconds) if seconds else None,
            "timed_steps": len(steps[warmup:]), "steps": len(steps)}


def write_report(out_dir: Path, report: dict[str, Any]) -> None:
    """``worker.json`` of a rank r > 0 (atomic: rank 0 polls for it)."""
    path = Path(out_dir) / REPORT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, allow_nan=False, default=str), encoding="utf-8")
    os.replace(tmp, path)


def gather_reports(ctx: Context, own: dict[str, Any], *, timeout: float = GATHER_TIMEOUT_S,
                   poll: float = 0.1) -> tuple[list[dict[str, Any]], list[str]]:
    """Rank 0: every rank's report (its own first), waiting up to ``timeout`` for the others'
    ``worker.json``; (reports, notes about the ranks that never reported)."""
    reports: dict[int, dict[str, Any]] = {0: own}
    deadline = time.monotonic() + timeout
    waiting = set(range(1, ctx.world))
    while waiting:
        for rank in sorted(waiting):
            try:
                reports[rank] = json.loads((ctx.worker_dir(rank) / REPORT_FILE).read_text(encoding="utf-8"))
                waiting.discard(rank)
            except (OSError, ValueError):
                pass
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    notes = [f"worker {rank} wrote no report within {timeout:g} s" for rank in sorted(waiting)]
    return [reports[r] for r in sorted(reports)], notes


def summary_fields(ctx: Context, params: Mapping[str, Any], reports: list[dict[str, Any]],
                   chief_throughput: float | None) -> dict[str, Any]:
    """The multi-worker part of rank 0's summary: the aggregate throughput (images/s of the
    whole cell) and each worker's own numbers.

    Synchronous cells: the median over rank 0's timed steps of (global images of the step /
    step seconds): every step ends with the gradient exchange, so rank 0's step time is the
    cell's.  ``dist_async`` (workers do not wait for each other): the sum of the workers' own
    throughputs.
    """
    own = [r.get("throughput") for r in reports]
    if ctx.sync:
        aggregate, method = chief_throughput, "global images per step / rank 0's step seconds (median over timed steps)"
    else:
        known = [t for t in own if t is not None]
        aggregate = sum(known) if len(known) == ctx.world else None
        method = "sum of the workers' own images/s (asynchronous updates: workers do not wait for each other)"
    checksums = [(r.get("exchange") or {}).get("weights_checksum") for r in reports]
    identical = None
    if ctx.sync and len(checksums) == ctx.world and all(c is not None for c in checksums):
        identical = max(checksums) - min(checksums) <= 1e-6 * max(1.0, abs(checksums[0]))
    per_worker = []
    for r in reports:  # the method is rank 0's, written once
        r = dict(r)
        if isinstance(r.get("exchange"), dict):
            r["exchange"] = {k: v for k, v in r["exchange"].items() if k != "method"}
        per_worker.append(r)
    return {
        "throughput": aggregate,
        "workers": ctx.world,
        "scaling": params.get("scaling"),
        "global_batch": global_batch(params),
        "per_worker_batch": global_batch(params) / ctx.world,
        "throughput_method": method,
        "worker_throughput": own,
        "worker_throughput_sum": sum(t for t in own if t is not None) if all(t is not None for t in own) else None,
        # synchronous data parallel keeps every replica's weights equal: a check that the
        # gradients really were exchanged (null when unknown or asynchronous)
        "replicas_identical": identical,
        "per_worker": per_worker,
    }
