"""What phase sampling costs (issue 16, docs/MODEL.md): the same training cell run by the
harness with ``phase_sampling`` at its default (every 20th timed step sampled) and at 0 (none),
side by side in alternating order, N pairs per framework, each side in its own process.

    python benchmarks/phase_sampling.py [--pairs 3] [--frameworks torch,tensorflow,...]
                                        [--model lenet5] [--batch 64] [--steps 310] [--every 20]

Per framework it prints every process (side, median unsampled timed step in ms, throughput)
and then:

- within the "on" processes (side by side in one process, which no speed mode can mix):
  a sampled step's cost, the median sampled step over the median unsampled one - 1, and what
  it adds to the run's wall time, that cost / every (target < 1 %); the throughput pays
  nothing by construction (the sampled steps are not in it);
- across processes, "on" over "off", of the medians over each side's processes: throughput
  (the harness's figure, the median over the timed steps not sampled) and mean step (over ALL
  timed steps, sampled ones included).  Processes differ by more than 1 % on this VM whatever
  they run, so this line tells a large cost from none, not a 1 % one.

On this VM a process runs its whole life in one of two speed modes (../shared/DESIGN.md); when
the bimodality rule (warehouse/modes.py) finds two modes among a framework's processes the
ratios are taken within each mode that has processes of both sides, as
benchmarks/harness_overhead.py does.  Synthetic data, 1 thread, the local environments
(built if absent).  Do not take timings while the machine is busy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from matrun.runner.environments.home import stage_harness
from matrun.runner.environments.venvs import ensure_env
from matrun.runner.planning.matrix import load_matrix
from matrun.warehouse.modes import two_modes

MATRIX = """
[fixed]
framework = "{framework}"
model = "{model}"
dataset = "synthetic"
synthetic_shape = {shape}
synthetic_train = {train}
synthetic_test = 64
batch_size = {batch}
iterations = {steps}
warmup_steps = 10
threads = 1
onednn_check = false
"""
SHAPES = {"lenet5": [1, 28, 28], "cifar_cnn": [3, 32, 32], "resnet18": [3, 32, 32], "alexnet": [3, 64, 64]}


@dataclass
class Process:
    side: str                  # "on" or "off"
    throughput: float
    step_s: float              # median of the unsampled timed steps
    mean_step_s: float         # mean of all timed steps, sampled ones included
    sampled: int
    sampled_cost: float | None  # median sampled step / median unsampled step - 1 (None: none sampled)


def run_once(python: Path, stage: Path, params: dict, every: int, side: str, workdir: Path) -> Process:
    run = Path(tempfile.mkdtemp(dir=workdir))
    spec = {"schema_version": 1, "sweep": "phase-sampling", "cell_id": "0" * 16, "repeat": 0, "attempt": 1,
            "env_id": "bench", "data_dir": "/nonexistent", "params": {**params, "phase_sampling": every}}
    (run / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(stage), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    subprocess.run([str(python), "-m", "matrun.runner.harness", "--spec", str(run / "spec.json"),
                    "--out", str(run)], env=env, cwd=run, check=True, capture_output=True, timeout=1800)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    steps = [e for e in events if e["type"] == "step" and e["phase"] in ("timed", "sampled")]
    unsampled = [e["seconds"] for e in steps if e["phase"] == "timed"]
    sampled = [e["seconds"] for e in steps if e["phase"] == "sampled"]
    summary = next(e for e in events if e["type"] == "summary")
    cost = statistics.median(sampled) / statistics.median(unsampled) - 1 if sampled else None
    return Process(side, summary["throughput"], statistics.median(unsampled),
                   statistics.fmean(e["seconds"] for e in steps), len(sampled), cost)


def within(processes: list[Process], every: int) -> str:
    costs = [p.sampled_cost for p in processes if p.sampled_cost is not None]
    if not costs:
        return "  within a process: - (no sampled step)"
    cost = statistics.median(costs)
    return (f"  within a process: a sampled step costs {100 * cost:+.2f} % (median over {len(costs)} processes: "
            f"{', '.join(f'{100 * c:+.1f}' for c in costs)}), the run's wall time {100 * cost / every:+.3f} % "
            "(target < 1 %); the throughput 0 (sampled steps are not in it)")


def ratios(processes: list[Process]) -> list[str]:
    modes = two_modes([p.step_s for p in processes])
    if modes is not None and modes.bimodal:
        groups = {"fast": [p for p in processes if p.step_s < modes.threshold],
                  "slow": [p for p in processes if p.step_s >= modes.threshold]}
        lines = [f"  modes: two (split at {1000 * modes.threshold:.2f} ms/step)"]
    else:
        groups, lines = {"one": processes}, []
    for mode, group in groups.items():
        on = [p for p in group if p.side == "on"]
        off = [p for p in group if p.side == "off"]
        if not on or not off:
            lines.append(f"  {mode}: - (no {'on' if not on else 'off'} process in this mode)")
            continue
        tput = statistics.median(p.throughput for p in on) / statistics.median(p.throughput for p in off)
        mean = statistics.median(p.mean_step_s for p in on) / statistics.median(p.mean_step_s for p in off)
        lines.append(f"  across processes, {mode} mode: throughput on/off {tput:.4f}, mean step on/off {mean:.4f} "
                     f"({len(on)} on, {len(off)} off processes)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--frameworks", default="torch,tensorflow,mxnet,jax,theano,chainer")
    parser.add_argument("--model", default="lenet5", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=310)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()
    stage = stage_harness()
    with tempfile.TemporaryDirectory(prefix="matrun-phase-sampling-") as tmp:
        workdir = Path(tmp)
        for framework in args.frameworks.split(","):
            matrix = workdir / f"{framework}.toml"
            matrix.write_text(MATRIX.format(framework=framework, model=args.model, shape=SHAPES[args.model],
                                            train=args.batch * args.steps, batch=args.batch, steps=args.steps),
                              encoding="utf-8")
            params = dict(load_matrix(matrix).cells[0].values)
            python = ensure_env(framework, params["variant"]).python
            processes = []
            for pair in range(args.pairs):
                order = [("on", args.every), ("off", 0)]
                for side, every in (order if pair % 2 == 0 else order[::-1]):
                    p = run_once(python, stage, params, every, side, workdir)
                    processes.append(p)
                    print(f"{framework} pair {pair} {side:>3}: step {1000 * p.step_s:7.3f} ms, "
                          f"{p.throughput:9.1f} img/s, mean step {1000 * p.mean_step_s:7.3f} ms, "
                          f"{p.sampled} sampled", flush=True)
            print(f"{framework} ({args.model}, batch {args.batch}, {args.steps} steps, every {args.every}):")
            print(within([p for p in processes if p.side == "on"], args.every))
            for line in ratios(processes):
                print(line, flush=True)


if __name__ == "__main__":
    main()
