"""The in-cell launcher of a multi-worker cell (``python -m matrun.runner.harness --launch PLAN``).

The host writes the plan (``<run>/workers.json``, built by ``runner/executors/workers.py``):
every process of the cell — an MXNet scheduler and servers first, then the workers — with its
role, rank, CPUs and the environment variables it gets on top of the launcher's own.  The
launcher:

1. with ``network = "private"`` / ``"private-required"`` (local executor), moves itself into a
   new network namespace that has only a loopback interface (an unprivileged user namespace
   when not root), so that nothing any framework binds — TensorFlow's gRPC servers listen on
   every interface — can be reached from outside the cell, as with Docker's ``--network none``;
   ``"inherit"``: the container already has no network;
2. starts every process (the same Python; workers run this harness, MXNet's scheduler and
   servers ``import mxnet`` with their ``DMLC_ROLE``), each pinned to its CPUs, killed with the
   launcher (``PR_SET_PDEATHSIG``); rank 0's output goes to the launcher's own stdout / stderr
   (the bundle's logs), every other process's to ``<its dir>/stdout.log`` / ``stderr.log``;
3. waits: when a worker fails, the others are stopped and the launcher exits with that
   worker's code (and an ``Error:`` line naming it); when every worker has finished, MXNet's
   scheduler and servers get ``PS_GRACE_S`` to finish, then are killed.  SIGTERM (the
   host's cancellation) is passed on to every process, which then has ``STOP_GRACE_S``.
4. watches the host's lease (``--lease-fd``, ``lease.py``) once in its network namespace: the
   host gone, the launcher kills its process group, workers included.

Standard library only.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from . import lease

STDOUT_LOG, STDERR_LOG = "stdout.log", "stderr.log"  # as warehouse/bundles/layout.py names them
PS_GRACE_S = 20.0
STOP_GRACE_S = 5.0
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
NETWORKS = ("private", "private-required", "inherit")


class LaunchError(Exception):
    """The plan cannot be carried out (bad plan, no private network where one is required)."""


def private_network() -> None:
    """Move this (single-threaded) process into a new network namespace with only ``lo``, up.

    As root a network namespace alone; otherwise a user namespace too, mapping the user to
    itself (files keep their owner).  OSError when the kernel refuses.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNET | (0 if uid == 0 else _CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET{'' if uid == 0 else ' | CLONE_NEWUSER'}): {os.strerror(err)}")
    if flags & _CLONE_NEWUSER:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w", encoding="ascii") as fh:
                fh.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        current = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", current | _IFF_UP))


def interfaces() -> list[str]:
    """Network interfaces this process can see (``["lo"]`` inside a private namespace)."""
    return sorted(name for _, name in socket.if_nameindex())


def command(role: str, spec: Path, code: str = "") -> list[str]:
    """The command line of a process of ``role``, with the launcher's own Python.  A
    parameter-server process runs the framework's ``code`` from the plan (framework.toml
    ``[workers] server_code``: for MXNet, importing it runs the role its variables name)."""
    if role == "worker":
        return [sys.executable, "-m", "matrun.runner.harness", "--spec", str(spec), "--out", "{out}"]
    if role in ("server", "scheduler") and code:
        return [sys.executable, "-c", code]
    raise LaunchError(f"unknown process role {role!r} (or a server without code) in the plan")


def child_setup(cpus: Iterable[int]) -> Callable[[], None]:
    """A ``preexec_fn``: the child dies with its parent (whatever kills the parent:
    PR_SET_PDEATHSIG) and runs on ``cpus`` (all CPUs when empty).  The local executor's too."""
    cpus = list(cpus)

    def setup() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


class _Proc:
    def __init__(self, entry: dict[str, Any], popen: subprocess.Popen, files: list[Any]) -> None:
        self.entry, self.popen, self.files = entry, popen, files

    @property
    def name(self) -> str:
        return f"{self.entry['role']} {self.entry['rank']}"

    def stderr_tail(self) -> str:
        path = Path(self.entry["out"]) / STDERR_LOG
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""


def load_plan(path: Path) -> dict[str, Any]:
    try:
        plan = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{path}: cannot read the launch plan: {exc}") from None
    if plan.get("schema_version") != 1 or not isinstance(plan.get("processes"), list) or not plan["processes"]:
        raise LaunchError(f"{path}: not a launch plan of schema_version 1 with processes")
    if plan.get("network", "inherit") not in NETWORKS:
        raise LaunchError(f"{path}: network must be one of {', '.join(NETWORKS)}")
    return plan


def run(plan_path: Path, spec_path: Path, *, lease_fd: int | None = None) -> int:
    """Carry out the plan; the exit code of the cell (0: every worker finished ok).  ``lease_fd``:
    the cell's lease (``lease.py``), watched once the process is in its network namespace."""
    plan = load_plan(plan_path)
    network = plan.get("network", "inherit")
    if network != "inherit":
        try:
            private_network()
        except OSError as exc:
            if network == "private-required":
                raise LaunchError(
                    f"this cell needs a private network namespace ({plan.get('network_reason', 'its framework binds every interface')}), "
                    f"but the kernel refused one: {exc}; run it with --executor docker") from None
            print(f"[matrun launcher] no private network namespace ({exc}); the workers use the host's "
                  "loopback interface", file=sys.stderr, flush=True)
    if lease_fd is not None:  # a thread: only now that unshare() has run
        lease.watch(lease_fd)
    print(f"[matrun launcher] {len(plan['processes'])} processes; network interfaces: "
          f"{', '.join(interfaces())}", file=sys.stderr, flush=True)
    procs: list[_Proc] = []
    try:
        for entry in plan["processes"]:
            procs.append(_start(entry, Path(spec_path)))
        return _supervise(procs)
    finally:
        _stop(procs)


def _start(entry: dict[str, Any], spec: Path) -> _Proc:
    out = Path(entry["out"])
    out.mkdir(parents=True, exist_ok=True)
    argv = [part.replace("{out}", str(out)) for part in command(entry["role"], spec, entry.get("code", ""))]
    env = {**os.environ, **{k: str(v) for k, v in entry.get("env", {}).items()}}
    files: list[Any] = []
    if entry["role"] == "worker" and entry["rank"] == 0:
        stdout = stderr = None  # the launcher's own: the bundle's stdout.log / stderr.log
    else:
        stdout = open(out / STDOUT_LOG, "wb")
        stderr = open(out / STDERR_LOG, "wb")
        files = [stdout, stderr]
    popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                             cwd=str(out), preexec_fn=child_setup(entry.get("cpus") or []))
    return _Proc(entry, popen, files)


def _supervise(procs: list[_Proc]) -> int:
    workers = [p for p in procs if p.entry["role"] == "worker"]
    others = [p for p in procs if p.entry["role"] != "worker"]
    while True:
        for p in procs:
            code = p.popen.poll()
            if code is None or (code == 0 and p in others):
                continue
            if code != 0 and (p in workers or any(w.popen.poll() is None for w in workers)):
                tail = p.stderr_tail() if p.files else ""
                print(f"Error: {p.name} (pid {p.popen.pid}) exited with code {code}"
                      + (f"; its stderr ends: {tail}" if tail else "")
                      + ("" if not p.files else f" (full log: {Path(p.entry['out']) / STDERR_LOG})"),
                      file=sys.stderr, flush=True)
                return code if code > 0 else 128 - code
        if all(w.popen.poll() == 0 for w in workers):
            break
        time.sleep(_POLL_S)
    deadline = time.monotonic() + PS_GRACE_S
    while any(p.popen.poll() is None for p in others) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return 0


def _stop(procs: list[_Proc]) -> None:
    """Every process still running gets SIGTERM, then SIGKILL after ``STOP_GRACE_S``."""
    running = [p for p in procs if p.popen.poll() is None]
    for p in running:
        try:
            p.popen.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p in running:
        try:
            p.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()
    for p in procs:
        for fh in p.files:
            fh.close()
