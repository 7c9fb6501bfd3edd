"""The machine state recorded before each run and the noise warnings (issue 15): real processes
on this machine for the load, sysfs trees written in the kernel's format for what this VM lacks
(cpufreq, boost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrun.runner.sweep import machine

BUSY = "import ctypes, sys\nif len(sys.argv) > 1: ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\nwhile True: pass\n"


def _detached_busy(name: str | None = None) -> int:
    """A busy process that is not this one's child (started through a shell that exits): the
    load of 'another process'.  Returns its PID."""
    args = [sys.executable, "-c", BUSY] + ([name] if name else [])
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
    out = subprocess.run(["setsid", "sh", "-c", f"{quoted} >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    time.sleep(0.3)  # running, and named
    return pid


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _cpufreq(root: Path, governors: dict[int, str], boost: str | None = None) -> Path:
    for cpu, governor in governors.items():
        d = root / f"cpu{cpu}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(governor + "\n")
    if boost is not None:
        (root / "cpufreq").mkdir(parents=True, exist_ok=True)
        (root / "cpufreq" / "boost").write_text(boost + "\n")
    (root / "smt").mkdir(parents=True, exist_ok=True)
    (root / "smt" / "control").write_text("on\n")
    (root / "smt" / "active").write_text("1\n")
    return root


def test_governors_boost_and_smt_from_sysfs(tmp_path):
    root = _cpufreq(tmp_path, {0: "performance", 1: "powersave", 2: "powersave"}, boost="1")
    assert machine.governors([0, 1, 2, 3], root) == {"performance": [0], "powersave": [1, 2]}
    assert machine.governors([0], root) == {"performance": [0]}
    assert machine.boost(root) is True and machine.smt(root) == {"control": "on", "active": True}
    (tmp_path / "cpufreq" / "boost").unlink()
    (tmp_path / "intel_pstate").mkdir()
    (tmp_path / "intel_pstate" / "no_turbo").write_text("1\n")
    assert machine.boost(root) is False


def test_this_vm_has_no_cpufreq_and_says_so_with_none():
    assert machine.governors(None) in (None, machine.governors(None))  # whatever it has, no exception
    state = machine.machine_state(window_s=0.05)
    assert state["cpu_model"] and state["loadavg"] and state["mem_available_bytes"] > 0
    assert state["cell_cpus"] == len(os.sched_getaffinity(0))
    assert isinstance(state["busy"], bool) and isinstance(state["busiest"], list)


def test_a_powersave_governor_is_warned_about_with_the_fix(tmp_path):
    root = _cpufreq(tmp_path, {0: "powersave", 1: "powersave"})
    warnings = machine.noise_warnings({0, 1}, window_s=0.05, root=root)
    governor = [w for w in warnings if "governor" in w]
    assert governor == ["CPU frequency governor 'powersave' on 2 of the cells' CPUs: clocks ramp with load and "
                        "timings drift; for benchmarks set 'performance' (cpupower frequency-set -g performance, "
                        "as root)"]
    assert [w for w in machine.noise_warnings({0}, window_s=0.05, root=_cpufreq(tmp_path / "p", {0: "performance"}))
            if "governor" in w] == []


def test_another_busy_process_flags_the_run_and_is_named():
    pid = _detached_busy()
    try:
        state = machine.machine_state(window_s=0.5)
        warnings = machine.noise_warnings(window_s=0.5)
    finally:
        _stop(pid)
    assert state["busy"] is True and state["others_on_cell_cpus"] >= 0.5
    assert pid in [p["pid"] for p in state["busiest"]]
    assert f"PID {pid}" in state["busy_reasons"][0]
    assert any(w.startswith("the machine is busy: other processes kept") and f"PID {pid}" in w
               and "give the cells other CPUs" in w for w in warnings)


def test_the_sweeps_own_children_and_the_engine_are_not_other_load():
    child = subprocess.Popen([sys.executable, "-c", BUSY])  # a cell of this sweep
    engine = _detached_busy("containerd")  # the container engine starting a cell's container
    try:
        time.sleep(0.3)
        load = machine.other_load(window_s=0.5)
    finally:
        child.kill()
        child.wait()
        _stop(engine)
    pids = [p["pid"] for p in load["busiest"]]
    assert child.pid not in pids and engine not in pids


def test_the_load_watch_measures_since_the_last_look_and_waits_only_the_rest(monkeypatch):
    # The waits LoadWatch asks for are recorded (and really slept): what is checked is what it
    # asked, never how long the machine took, so a loaded CI host cannot fail it.
    waits: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        real_sleep(seconds)

    watch = machine.LoadWatch()
    real_sleep(0.3)
    monkeypatch.setattr(machine.time, "sleep", sleep)
    first = watch.load(None, min_window_s=0.1)
    assert waits == [] and first["window_s"] >= 0.3  # the time since it started, no wait
    second = watch.load(None, min_window_s=0.2)
    assert len(waits) == 1 and 0 < waits[0] <= 0.2  # only the rest of the window was waited
    assert second["window_s"] >= 0.199  # waited out (the window is rounded to the millisecond)
    monkeypatch.setattr(machine.time, "sleep", real_sleep)
    pid = _detached_busy()
    try:
        watch.restart()
        time.sleep(0.4)
        busy = watch.load(None)
    finally:
        _stop(pid)
    assert pid in [p["pid"] for p in busy["busiest"]] and busy["others_cpus"] >= 0.5


@pytest.mark.parametrize("share, cpus, busy", [(0.15, 1, False), (0.25, 1, True), (0.3, 4, False), (0.45, 4, True)])
def test_the_busy_rule(share, cpus, busy):
    load = {"others_on_cell_cpus": share, "window_s": 0.2, "busiest": [{"pid": 1, "name": "x", "cpu_percent": 100 * share}]}
    assert bool(machine.is_busy(load, cpus)) is busy
