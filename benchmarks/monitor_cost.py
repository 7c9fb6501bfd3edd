"""Monitor cost: CPU time the sampler spends per second of sampling.

Runs the real ``Monitor`` against a real process tree (a parent with two busy children, so
the tree walk and per-process reads are exercised) for a fixed time at several rates, and
prints the sampler's CPU use as a percentage of one core.  The benchmark process does
nothing else while sampling, so its own CPU time (getrusage) is the monitor's.

    python benchmarks/monitor_cost.py [--seconds 10]

Target (issue 2): at most 1 % of one core at the default rate.
"""

from __future__ import annotations

import argparse
import os
import signal
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from matrun.runner.executors.monitor import DEFAULT_INTERVAL_S, Monitor

TREE = ("import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.01)']) for _ in range(2)]\n"
        "time.sleep(3600)\n")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(interval: float, seconds: float, pid: int, out: Path) -> tuple[float, int]:
    monitor = Monitor(pid, out, interval_s=interval)
    c0, t0 = cpu_seconds(), time.monotonic()
    monitor.start()
    time.sleep(seconds)
    aggregates = monitor.stop()
    return 100.0 * (cpu_seconds() - c0) / (time.monotonic() - t0), aggregates["samples"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    tree = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    try:
        time.sleep(1.0)
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{'interval':>9} {'rate':>7} {'samples':>8} {'CPU % of one core':>18}")
            for interval in (DEFAULT_INTERVAL_S, 0.1, 0.05):
                pct, n = measure(interval, args.seconds, tree.pid, Path(tmp) / "m.jsonl")
                mark = "  <- default" if interval == DEFAULT_INTERVAL_S else ""
                print(f"{interval:>8.2f}s {1 / interval:>5.0f}Hz {n:>8} {pct:>17.3f}%{mark}")
    finally:
        os.killpg(tree.pid, signal.SIGKILL)  # the parent and its children, all ours
        tree.wait()


if __name__ == "__main__":
    main()
