"""Container overhead: the same LeNet-5 cell through the docker executor and the local executor.

Side by side, in alternating order, N pairs: training throughput (the harness's median
images/s over timed steps) docker / local, and the per-cell fixed cost: from just before
the executor starts the cell (container create + start, or the subprocess spawn) to the
harness's header event (interpreter up, spec read, framework adapter imported; the cell's
oneDNN check is off here, it would run before the header), and to the end of the first step
(that plus the harness's ``time_to_first_step``: data, model, first step).  Then the bare
start: an interpreter that prints the time, in a container of the image (same security
options) vs a subprocess of the local venv's Python.  Prints each pair and the medians
(target ratio >= 0.98).

    python benchmarks/docker_overhead.py [--pairs 5] [--threads 1] [--batch 64] [--steps 600]

Needs a Docker engine with the torch:cpu image (matrun build), the torch environment of the
local executor, and Debian's dataset-fashion-mnist.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from matrun.warehouse.bundles.layout import EVENTS, SPEC
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.runner.datasets.staging import default_data_dir
from matrun.runner.environments.venvs import ensure_env
from matrun.runner.executors.protocol import RunRequest
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.planning.matrix import parse_matrix


def cell(threads: int, batch: int, steps: int, warmup: int, cpuset: str) -> dict:
    fixed = {"dataset": "fashion-mnist", "iterations": steps, "warmup_steps": warmup, "batch_size": batch,
             "threads": threads, "lr": 0.01, "momentum": 0.9, "cpuset": cpuset, "onednn_check": False}
    (c,) = parse_matrix({"fixed": fixed}, path=Path("matrix.toml")).cells
    return dict(c.values)


def run_once(executor, params: dict, data: Path, run_dir: Path) -> dict:
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / SPEC, {"schema_version": 1, "sweep": "docker-overhead", "cell_id": "b" * 16,
                                       "repeat": 0, "attempt": 1, "env_id": "e", "data_dir": str(data),
                                       "params": params})
    t0 = time.time()
    outcome = executor.run(RunRequest(run_dir=run_dir, params=params, env_id="e", timeout=600, data_dir=data))
    if outcome.status != "ok":
        raise SystemExit(f"{executor.name}: {outcome.status}\n{outcome.error_tail}")
    events = [json.loads(line) for line in (run_dir / EVENTS).read_text().splitlines()]
    header = next(e for e in events if e["type"] == "header")
    summary = next(e for e in events if e["type"] == "summary")
    return {"throughput": summary["throughput"], "to_harness": header["t"] - t0,
            "to_first_step": header["t"] - t0 + summary["time_to_first_step"], "wall": outcome.wall_seconds}


_PRINT_TIME = ["-c", "import time; print(time.time())"]


def bare_start_docker(executor: DockerExecutor) -> float:
    ref = executor.image("torch", "cpu")
    t0 = time.time()
    container = executor.client.containers.create(
        ref.image_id, ["python3", *_PRINT_TIME], network_mode="none", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], user="65534:65534", read_only=True)
    try:
        container.start()
        container.wait(timeout=60)
        return float(container.logs(stdout=True, stderr=False).decode().split()[-1]) - t0
    finally:
        container.remove(force=True)


def bare_start_local(python: Path) -> float:
    t0 = time.time()
    out = subprocess.run([str(python), *_PRINT_TIME], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1]) - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--cpuset", default="0")
    parser.add_argument("--data", type=Path, default=default_data_dir())
    a = parser.parse_args()
    params = cell(a.threads, a.batch, a.steps, a.warmup, a.cpuset)
    docker, local = DockerExecutor(), LocalExecutor()
    docker.prepare({("torch", "cpu")}, log=print)
    local.prepare({("torch", "cpu")}, log=print)
    rows = []
    print(f"LeNet-5, Fashion-MNIST, threads {a.threads}, cpuset {a.cpuset or '-'}, batch {a.batch}, "
          f"{a.steps} steps ({a.warmup} warm-up)")
    print(f"{'pair':>4} {'order':>13} {'docker img/s':>12} {'local img/s':>11} {'ratio':>6} "
          f"{'d start':>8} {'l start':>8} {'d 1st step':>10} {'l 1st step':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(a.pairs):
            order = [("docker", docker), ("local", local)]
            if pair % 2:
                order.reverse()
            got = {name: run_once(ex, params, a.data, Path(tmp) / f"{pair}-{name}") for name, ex in order}
            d, loc = got["docker"], got["local"]
            rows.append((d, loc))
            print(f"{pair + 1:>4} {','.join(n for n, _ in order):>13} {d['throughput']:>12.0f} "
                  f"{loc['throughput']:>11.0f} {d['throughput'] / loc['throughput']:>6.3f} "
                  f"{d['to_harness']:>8.3f} {loc['to_harness']:>8.3f} {d['to_first_step']:>10.3f} "
                  f"{loc['to_first_step']:>10.3f}")
    python = ensure_env("torch", "cpu").python
    starts = [(bare_start_docker(docker), bare_start_local(python)) for _ in range(5)]
    print("bare start to a running interpreter (5 each): docker "
          + " ".join(f"{d:.3f}" for d, _ in starts) + " s; local " + " ".join(f"{l:.3f}" for _, l in starts) + " s")
    med = lambda xs: statistics.median(xs)  # noqa: E731
    print(f"median ratio docker/local: {med([d['throughput'] / l['throughput'] for d, l in rows]):.3f} "
          f"(target >= 0.98)")
    print(f"median bare start: docker {med([d for d, _ in starts]):.3f} s, local {med([l for _, l in starts]):.3f} s")
    print(f"median start to harness: docker {med([d['to_harness'] for d, _ in rows]):.3f} s, "
          f"local {med([l['to_harness'] for _, l in rows]):.3f} s; "
          f"to the end of the first step: docker {med([d['to_first_step'] for d, _ in rows]):.3f} s, "
          f"local {med([l['to_first_step'] for _, l in rows]):.3f} s")


if __name__ == "__main__":
    main()
