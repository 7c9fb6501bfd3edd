"""A pytest plugin and a summary: where the test suite's time and this machine's CPU go, per test
and per file (how tests/conftest.py's FILE_SECONDS was measured).

    PYTHONPATH=benchmarks SUITE_PROFILE=/tmp/suite.jsonl .venv/bin/pytest -p suite_profile \
        -n 2 --dist loadfile -m "not serial"
    python benchmarks/suite_profile.py /tmp/suite.jsonl

Each test (setup, call and teardown together) appends one JSON line: its wall seconds, the
seconds of CPU the whole machine spent meanwhile (from /proc/stat: the containers, the engine
and Slurm's daemons included; with two workers it is both workers' CPU) and the CPU seconds of
the test's own process and the children it waited for.  The summary prints, per file, the
tests, wall seconds, machine CPU seconds, own CPU seconds and machine CPU per wall second,
longest first, then the FILE_SECONDS entries of the files of 10 s and more.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict

OUT = os.environ.get("SUITE_PROFILE", "suite-profile.jsonl")


def _machine_busy() -> float:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # all but idle, iowait


def _own_cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


try:
    import pytest
except ImportError:  # the summary runs without pytest
    pytest = None

if pytest is not None:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        t0, m0, c0 = time.monotonic(), _machine_busy(), _own_cpu()
        yield
        record = {"id": item.nodeid, "wall": round(time.monotonic() - t0, 3),
                  "machine_cpu": round(_machine_busy() - m0, 2), "own_cpu": round(_own_cpu() - c0, 2),
                  "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
        with open(OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def summary(path: str) -> None:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for row in rows:
        f = files[row["id"].split("::")[0].split("/")[-1]]
        f[0] += 1
        f[1] += row["wall"]
        f[2] += row["machine_cpu"]
        f[3] += row["own_cpu"]
    print(f"{'file':40} {'tests':>5} {'wall s':>8} {'machine':>8} {'own':>8} {'cpu/wall':>8}")
    for name, (n, wall, machine, own) in sorted(files.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:40} {n:5d} {wall:8.1f} {machine:8.1f} {own:8.1f} {machine / max(wall, 1e-9):8.2f}")
    print(f"{'all':40} {len(rows):5d} {sum(f[1] for f in files.values()):8.1f} "
          f"{sum(f[2] for f in files.values()):8.1f} {sum(f[3] for f in files.values()):8.1f}")
    print("FILE_SECONDS:", {name: round(f[1]) for name, f in sorted(files.items(), key=lambda kv: -kv[1][1])
                            if f[1] >= 10})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/suite_profile.py PROFILE.jsonl")
    summary(sys.argv[1])
