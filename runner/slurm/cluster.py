"""A local Slurm test cluster on this host, for the tests and for trying the slurm executor.

``start_cluster`` / ``stop_cluster`` (``matrun slurm start|stop|status``): a private ``munged``,
``slurmctld -D`` and three ``slurmd -D`` started in their own sessions, their PIDs recorded;
stopped by those PIDs only, each checked to still be the daemon it was.  It listens on 127.0.0.1
only as far as its peers go (SlurmctldHost=localhost, NodeAddr=127.0.0.1).  Node ``node0`` (the
default partition ``matrun``, this host's CPUs) has two fake GPUs (character devices 195:N under
its state directory) so ``--gres=gpu:N`` schedules; nodes ``n1`` and ``n2`` (partition ``multi``,
one CPU each, slurmds of their own on this host) let a multi-node cell be scheduled on two
nodes.  Its Epilog is matrun's (``runner/slurm/epilog.py``).  Nothing else of matrun uses it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from matrun.errors import InputError
from matrun.runner.slurm.state import SlurmUnavailable

CLUSTER_NAME = "matrun"
CTLD_HOST = "localhost"  # slurmctld's host name (at 127.0.0.1)
# The node of the default partition.  Not "localhost": Slurm 22.05 refuses a second node on the
# same host next to a node named localhost ("Duplicated NodeHostName").
NODE = "node0"
FAKE_GPUS = 2
EPILOG = "epilog"  # the test cluster's Epilog script, in its state directory
# Partition "multi": two more nodes on the same host, one CPU each and no GPU, each with its
# own slurmd (Slurm's multiple-slurmd mode: the same NodeHostname, its own port), so that
# multi-node cells (nodes = 2) are scheduled, started by srun on both and tested for real.
MULTI_PARTITION = "multi"
MULTI_NODES = ("n1", "n2")
CLUSTER_START_TIMEOUT = 60.0
_DAEMONS = (*(f"slurmd-{n}" for n in reversed(MULTI_NODES)), "slurmd", "slurmctld", "munged")  # stop order


def _process_name(daemon: str) -> str:
    """The program a recorded daemon runs (``slurmd-n1`` is a slurmd)."""
    return daemon.split("-", 1)[0]


@dataclass(frozen=True)
class LocalCluster:
    """A cluster ``start_cluster`` started: its state directory, slurm.conf and daemon PIDs."""

    state_dir: Path
    conf: Path
    pids: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # from the first daemon's start to the node being idle

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, matrun) needs in its environment to use this cluster."""
        return {"SLURM_CONF": str(self.conf)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_resources() -> tuple[int, int]:
    """(CPUs, memory in MiB) to declare for the node: what this host has, memory with 10 % kept back."""
    cpus = os.cpu_count() or 1
    mem_mb = 1024
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_mb = int(line.split()[1]) // 1024
                    break
    except OSError:
        pass
    return cpus, max(256, int(mem_mb * 0.9))


def cluster_config_text(state_dir: Path, *, ctld_port: int, slurmd_port: int, cpus: int, memory_mb: int,
                        gpus: int = FAKE_GPUS, kill_wait: int = 10, min_job_age: int = 300,
                        multi_ports: Sequence[int] = ()) -> tuple[str, str]:
    """(slurm.conf, gres.conf) of the test cluster (pure): node ``node0`` in the default
    partition, and with ``multi_ports`` (one per name of ``MULTI_NODES``) partition ``multi``."""
    s = state_dir
    conf = "\n".join([
        "# Written by matrun (runner/slurm/cluster.py): a one-node test cluster on this host.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={CTLD_HOST}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={s / 'munge' / 'munge.sock'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={s / 'state'}",
        f"SlurmdSpoolDir={s / 'spool' / '%n'}",
        f"SlurmctldPidFile={s / 'slurmctld.daemon.pid'}",
        f"SlurmdPidFile={s / 'slurmd-%n.daemon.pid'}",
        f"SlurmctldLogFile={s / 'slurmctld.log'}",
        f"SlurmdLogFile={s / 'slurmd-%n.log'}",
        # Containers started by a task are outside Slurm's process tracking either way (the task
        # traps TERM and removes its container); linuxproc needs no cgroup delegation.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        f"DefMemPerCPU={max(64, memory_mb // max(1, cpus) // 4)}",
        "GresTypes=gpu",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={s / 'jobcomp.log'}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "ReturnToService=2",
        f"KillWait={kill_wait}",
        # removes the containers of a task Slurm SIGKILLed (runner/slurm/epilog.py)
        f"Epilog={s / EPILOG}",
        f"MinJobAge={min_job_age}",
        "SchedulerType=sched/backfill",
        f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={CTLD_HOST} Port={slurmd_port} CPUs={cpus} "
        f"RealMemory={memory_mb} "
        f"Gres=gpu:{gpus} State=UNKNOWN",
        *(f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={name} Port={port} CPUs=1 "
          f"RealMemory={max(256, memory_mb // 2)} State=UNKNOWN" for name, port in zip(MULTI_NODES, multi_ports)),
        f"PartitionName=matrun Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        *([f"PartitionName={MULTI_PARTITION} Nodes={','.join(MULTI_NODES)} Default=NO MaxTime=INFINITE State=UP"]
          if multi_ports else []),
        "",
    ])
    gres = (f"NodeName={NODE} Name=gpu File={s / 'dev' / 'nvidia'}[0-{gpus - 1}]\n" if gpus > 1 else
            f"NodeName={NODE} Name=gpu File={s / 'dev' / 'nvidia0'}\n")
    return conf, gres


def epilog_script(python: str) -> str:
    """The test cluster's Epilog: matrun's epilog run by this interpreter (slurmd runs the
    Epilog as an executable with no arguments)."""
    return ("#!/bin/sh\n# Written by matrun (runner/slurm/cluster.py): remove the containers of a matrun task "
            "Slurm killed.\n"
            f"exec {shlex.quote(python)} -m matrun.runner.slurm.epilog\n")


def write_cluster_config(state_dir: Path, **kwargs: Any) -> Path:
    """Write slurm.conf, gres.conf, the fake GPU devices and a munge key; return slurm.conf."""
    state_dir = state_dir.absolute()
    for sub in ("state", "spool", "dev", "munge"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    for path in (state_dir, state_dir / "munge"):
        os.chmod(path, 0o755)  # munged wants its socket directory searchable by all
    cpus, memory_mb = node_resources()
    kwargs.setdefault("cpus", cpus)
    kwargs.setdefault("memory_mb", memory_mb)
    kwargs.setdefault("ctld_port", free_port())
    kwargs.setdefault("slurmd_port", free_port())
    kwargs.setdefault("multi_ports", [free_port() for _ in MULTI_NODES])
    gpus = kwargs.get("gpus", FAKE_GPUS)
    for n in range(gpus):
        dev = state_dir / "dev" / f"nvidia{n}"
        if not dev.exists():  # a fake NVIDIA device: major 195, as the real ones
            os.mknod(dev, 0o600 | 0o020000, os.makedev(195, n))
    key = state_dir / "munge" / "munge.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(1024))
    conf, gres = cluster_config_text(state_dir, **kwargs)
    epilog = state_dir / EPILOG
    epilog.write_text(epilog_script(sys.executable))
    os.chmod(epilog, 0o755)
    (state_dir / "slurm.conf").write_text(conf)
    (state_dir / "gres.conf").write_text(gres)
    return state_dir / "slurm.conf"


def _pid_file(state_dir: Path, daemon: str) -> Path:
    return state_dir / f"{daemon}.pid"


def _is_daemon(pid: int, name: str) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return comm == name and state != "Z"


def _spawn(args: list[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(env), start_new_session=True)  # setsid


def start_cluster(state_dir: Path, *, timeout: float = CLUSTER_START_TIMEOUT, **config: Any) -> LocalCluster:
    """Start munged, ``slurmctld -D`` and ``slurmd -D`` for a one-node cluster under ``state_dir``.

    Needs root and Debian's ``slurmctld slurmd slurm-client munge``.  Each daemon runs in its
    own session; its PID goes to ``state_dir/<daemon>.pid``.  Returns once ``sinfo`` shows the
    node idle; on failure everything started here is stopped again.
    """
    for name, package in (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
                          ("sinfo", "slurm-client")):
        if shutil.which(name) is None:
            raise SlurmUnavailable(f"{name} is not installed (Debian: apt-get install slurmctld slurmd "
                                   f"slurm-client munge; missing: {package})")
    state_dir = state_dir.absolute()
    if len(str(state_dir / "munge" / "munge.sock").encode()) > 100:
        raise InputError(f"state directory {state_dir} is too long for munge's socket path; use a shorter one")
    running = [d for d in _DAEMONS if _recorded(state_dir, d)]
    if running:
        raise InputError(f"a cluster started by matrun already runs from {state_dir} ({', '.join(running)}); "
                         f"stop it first (matrun slurm stop)")
    conf = write_cluster_config(state_dir, **config)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = time.perf_counter()
    munge = state_dir / "munge"
    procs: dict[str, subprocess.Popen] = {}
    commands = {
        "munged": ["munged", "-F", "--force", f"--socket={munge / 'munge.sock'}", f"--key-file={munge / 'munge.key'}",
                   f"--pid-file={munge / 'munged.daemon.pid'}", f"--log-file={munge / 'munged.log'}",
                   f"--seed-file={munge / 'munged.seed'}", "--origin=127.0.0.1"],
        "slurmctld": ["slurmctld", "-D", "-f", str(conf)],
        "slurmd": ["slurmd", "-D", "-N", NODE, "-f", str(conf)],
        **{f"slurmd-{n}": ["slurmd", "-D", "-N", n, "-f", str(conf)] for n in MULTI_NODES},
    }
    try:
        for daemon in ("munged", "slurmctld", "slurmd", *(f"slurmd-{n}" for n in MULTI_NODES)):
            proc = _spawn([shutil.which(commands[daemon][0]) or commands[daemon][0], *commands[daemon][1:]],
                          state_dir / f"{daemon}.out", env)
            procs[daemon] = proc
            _pid_file(state_dir, daemon).write_text(f"{proc.pid}\n")
            if daemon == "munged":
                _wait_for(lambda: (munge / "munge.sock").exists(), proc, "munged", timeout, state_dir)
        deadline = time.perf_counter() + timeout
        while True:
            for daemon, proc in procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{daemon} exited with {proc.returncode} while starting; "
                                           f"see {state_dir / (daemon + '.out')}")
            probe = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=30)
            states = probe.stdout.split()
            if probe.returncode == 0 and states == ["idle"] * (1 + len(MULTI_NODES)):
                break
            if time.perf_counter() > deadline:
                raise SlurmUnavailable(f"the node did not become idle within {timeout:.0f} s "
                                       f"(sinfo: {(probe.stdout + probe.stderr).strip()[-200:]}); "
                                       f"see {state_dir}/*.log")
            time.sleep(0.2)
    except BaseException:
        for daemon in _DAEMONS:  # ours, by the handles we hold (a PID check could race the exec)
            proc = procs.get(daemon)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            _pid_file(state_dir, daemon).unlink(missing_ok=True)
        raise
    pids = {daemon: proc.pid for daemon, proc in procs.items()}
    return LocalCluster(state_dir, conf, pids, time.perf_counter() - started)


def _wait_for(ready: Callable[[], bool], proc: subprocess.Popen, name: str, timeout: float, state_dir: Path) -> None:
    deadline = time.perf_counter() + timeout
    while not ready():
        if proc.poll() is not None:
            raise SlurmUnavailable(f"{name} exited with {proc.returncode}; see {state_dir}")
        if time.perf_counter() > deadline:
            raise SlurmUnavailable(f"{name} did not come up within {timeout:.0f} s; see {state_dir}")
        time.sleep(0.05)


def _recorded(state_dir: Path, daemon: str) -> int | None:
    try:
        pid = int(_pid_file(state_dir, daemon).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_daemon(pid, _process_name(daemon)) else None


def cluster_running(state_dir: Path) -> dict[str, int]:
    """The daemons of the cluster under ``state_dir`` that still run: name → PID."""
    state_dir = state_dir.absolute()
    return {d: pid for d in _DAEMONS if (pid := _recorded(state_dir, d)) is not None}


def stop_cluster(state_dir: Path, *, timeout: float = 30.0) -> list[str]:
    """Cancel every job of the cluster, then stop its daemons by their recorded PIDs (each only
    while /proc says it still is that daemon).  Returns the daemons stopped."""
    state_dir = state_dir.absolute()
    conf = state_dir / "slurm.conf"
    if _recorded(state_dir, "slurmctld") and conf.exists():
        env = {**os.environ, "SLURM_CONF": str(conf)}
        try:  # a job left running would keep its container: let the tasks' traps stop them
            subprocess.run(["scancel", "--full", "-u", str(os.getuid())], env=env, capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=30)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL, timeout=30)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.3)
        except (OSError, subprocess.SubprocessError):
            pass
    stopped = []
    for daemon in _DAEMONS:
        pid = _recorded(state_dir, daemon)
        if pid is None:
            _pid_file(state_dir, daemon).unlink(missing_ok=True)
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        name = _process_name(daemon)
        while time.monotonic() < deadline and not _gone(pid, name):
            time.sleep(0.05)
        if not _gone(pid, name) and _is_daemon(pid, name):
            os.kill(pid, signal.SIGKILL)
            _gone(pid, name)
        _pid_file(state_dir, daemon).unlink(missing_ok=True)
        stopped.append(daemon)
    return stopped


def _gone(pid: int, name: str) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it
        if done == pid:
            return True
    except ChildProcessError:
        pass
    return not _is_daemon(pid, name)
