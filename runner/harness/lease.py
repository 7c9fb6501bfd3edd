"""The cell's lease on its sweep: no cell trains without a live sweep behind it.

The host that starts a cell holds the write end of a pipe whose read end is the cell's
``--lease-fd`` (both executors use stdin, fd 0): the local executor a pipe of its own, the
docker executor the container's stdin, attached (``StdinOnce``) for as long as it waits for the
container.  The host never writes to it.  When the host process dies, however it dies (``kill
-9`` of a sweep or of a Slurm task included), the kernel closes its end and the read here
returns end-of-file: the watchdog says so on stderr and kills the cell's process group — every
process of the cell: the harness, its oneDNN check, a multi-worker cell's launcher and workers
(those die with the launcher too: ``PR_SET_PDEATHSIG``).  In a container the harness is PID 1,
which its own SIGKILL does not reach: it then exits with ``LEASE_LOST_EXIT``, which ends every
process of the container.  The run is recorded by the next sweep, which finds the exited
container (``runner/executors/orphans.py``) or the bundle without ``result.json``.

A thread, not a signal: it sees the end whatever the main thread is doing (a long framework
call, a stuck collective).  Started after a multi-worker launcher has entered its private
network namespace (``unshare`` of a user namespace needs a single-threaded process).

Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

#: The exit status of a cell stopped because its lease ended where its own SIGKILL does not
#: reach it (PID 1 of a container): 128 + SIGKILL, as if killed.
LEASE_LOST_EXIT = 128 + signal.SIGKILL
#: What the cell's stderr says when it stops itself (the host recognises the words).
LEASE_LOST_MARK = "[matrun harness] the process that started this cell (the sweep) is gone"
MESSAGE = (LEASE_LOST_MARK + ": its lease (fd {fd}) reached end-of-file; the cell stops itself "
           "(no cell trains without a live sweep)")


def watch(fd: int) -> threading.Thread:
    """Start the watchdog of lease ``fd`` (a daemon thread); it stops the cell at end-of-file
    or when ``fd`` cannot be read (a lease never held)."""
    thread = threading.Thread(target=_wait_then_stop, args=(fd,), name="matrun-lease", daemon=True)
    thread.start()
    return thread


def _wait_then_stop(fd: int) -> None:
    try:
        while os.read(fd, 4096):  # the host never writes; anything read is ignored
            pass
    except OSError:
        pass
    stop_cell(MESSAGE.format(fd=fd))


def stop_cell(message: str) -> None:
    """Say why on stderr, then kill this process's group (when it leads one: the executors
    start the cell in its own session) and exit."""
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if os.getpgrp() == os.getpid():
        try:
            os.killpg(os.getpid(), signal.SIGKILL)  # PID 1 of a container survives this ...
        except OSError:
            pass
    os._exit(LEASE_LOST_EXIT)  # ... and ends the container by exiting
