"""Slurm scheduling overhead: what the slurm executor adds per cell on a one-node cluster.

Starts a one-node cluster of its own (``runner/slurm/cluster.py``, stopped again at the end; or uses
the one ``SLURM_CONF`` names with ``--existing``), runs N tiny cells (synthetic LeNet-5, one
epoch, 1 thread on CPU 0) with ``matrun sweep --executor slurm`` in this process (default
settings: ``--exclusive``, so the tasks run one after another), then the same cells with the
docker executor, and prints per cell:

- submit → script: from the sbatch call to the batch script's process starting on the node
  (Slurm scheduling, slurmstepd);
- script → task: from there to the task's Python writing ``slurm.json`` (interpreter, imports);
- task → container: from there to the docker executor's start (host facts, image lookup);
- previous task end → task: for tasks after the first, the gap in which the node was idle
  (``--exclusive`` serialises the array: Slurm starting the next task);
- end → ingested: from ``result.json`` being written on the node to the sweep having ingested
  the run (the sweep looks for new results every 0.5 s);

and the totals: the slurm sweep's wall time against the docker sweep's for the same cells.

    python benchmarks/slurm_overhead.py [--cells 6] [--existing]

Needs root (for the cluster), Debian's Slurm and munge, a Docker engine with the torch:cpu image.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from matrun.runner.slurm import cluster as slurm
from matrun.runner.sweep.run import run_sweep

MATRIX = """[sweep]
name = "{name}"
executor = "{executor}"
[slurm]
poll_interval = {poll}
[fixed]
dataset = "synthetic"
synthetic_train = 256
synthetic_test = 128
batch_size = 32
epochs = 1
warmup_steps = 2
threads = 1
cpuset = "0"
onednn_check = false
[axes]
lr = [{lrs}]
"""


def sweep(directory: Path, executor: str, cells: int, poll: float) -> tuple[float, dict[str, float]]:
    directory.mkdir(parents=True)
    lrs = ", ".join(f"{0.01 + 0.001 * i:.3f}" for i in range(cells))
    (directory / "matrix.toml").write_text(MATRIX.format(name=executor, executor=executor, poll=poll, lrs=lrs))
    ingested: dict[str, float] = {}

    def on_event(event) -> None:
        if event.kind == "run-end":
            ingested[event.cell.cell_id] = time.time()
            if event.outcome.status != "ok":
                raise SystemExit(f"{executor}: {event.outcome.status}: {event.outcome.error_tail}")
        elif event.kind == "message":
            print(f"  {event.text}")

    t0 = time.perf_counter()
    summary = run_sweep(matrix_path=directory / "matrix.toml", on_event=on_event)
    wall = time.perf_counter() - t0
    assert summary.by_status == {"ok": cells}, summary
    return wall, ingested


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=6)
    parser.add_argument("--poll", type=float, default=10.0, help="[slurm] poll_interval (squeue calls)")
    parser.add_argument("--existing", action="store_true", help="use the cluster SLURM_CONF names")
    a = parser.parse_args()
    state = None
    if not a.existing:
        state = Path(tempfile.mkdtemp(prefix="matrun-slurm-bench-", dir="/tmp"))
        cluster = slurm.start_cluster(state)
        os.environ.update(cluster.env)
        print(f"one-node cluster up in {cluster.seconds:.2f} s ({state})")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"slurm sweep of {a.cells} cells:")
            slurm_wall, ingested = sweep(Path(tmp) / "slurm", "slurm", a.cells, a.poll)
            print(f"docker sweep of the same {a.cells} cells:")
            docker_wall, _ = sweep(Path(tmp) / "docker", "docker", a.cells, a.poll)
            sweep_dir = Path(tmp) / "slurm" / "results" / "slurm"
            (sub,) = (sweep_dir / ".slurm").iterdir()
            submitted = json.loads((sub / "job.json").read_text())["submitted_at"]
            rows = []
            for task in json.loads((sub / "tasks.json").read_text())["tasks"]:
                run = Path(task["run_dir"])
                record = json.loads((run / "slurm.json").read_text())
                result = json.loads((run / "result.json").read_text())
                rows.append({"index": task["index"], "task": record["started_unix"],
                             "script": record.get("process_started_unix") or record["started_unix"],
                             "container": ts(result["started_at"]), "end": (run / "result.json").stat().st_mtime,
                             "cell": result["wall_seconds"], "ingested": ingested[task["cell_id"]]})
        rows.sort(key=lambda r: r["task"])
        print(f"{'task':>4} {'submit→script':>13} {'script→task':>11} {'task→container':>14} {'idle gap':>9} "
              f"{'cell s':>7} {'end→ingested':>12}")
        gaps = []
        for i, r in enumerate(rows):
            gap = r["script"] - rows[i - 1]["end"] if i else None
            if gap is not None:
                gaps.append(gap)
            print(f"{r['index']:>4} {r['script'] - submitted:>13.2f} {r['task'] - r['script']:>11.2f} "
                  f"{r['container'] - r['task']:>14.2f} {'-' if gap is None else f'{gap:.2f}':>9} {r['cell']:>7.2f} "
                  f"{r['ingested'] - r['end']:>12.2f}")
        med = statistics.median
        print(f"median: first batch script started {rows[0]['script'] - submitted:.2f} s after sbatch; node idle "
              f"between two tasks {med(gaps) if gaps else float('nan'):.2f} s; script→task "
              f"{med([r['task'] - r['script'] for r in rows]):.2f} s; task→container "
              f"{med([r['container'] - r['task'] for r in rows]):.2f} s; end→ingested "
              f"{med([r['ingested'] - r['end'] for r in rows]):.2f} s")
        per_cell = (slurm_wall - docker_wall) / a.cells
        print(f"sweep wall time: slurm {slurm_wall:.1f} s, docker {docker_wall:.1f} s: "
              f"+{per_cell:.2f} s per cell through Slurm")
    finally:
        if state is not None:
            slurm.stop_cluster(state)
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
