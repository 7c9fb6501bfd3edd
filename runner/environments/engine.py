"""A local Docker engine: find one, start one when asked, make the base image.

Safety rules (docs/HANDOFF-issue4-build.md, DESIGN.md "Facts about these machines"):

- Only a local engine is used: a ``unix://`` socket, or ``tcp://`` on the loopback address.
  An engine on any other address (a private-range host, the Docker bridge) is refused, never
  contacted.
- ``dockerd`` is started only when the caller asks (``start_engine``), with
  ``--bridge=none --iptables=false`` (no bridge network, no firewall rules on the host), in
  its own session (setsid) so it outlives neither more nor less than intended, and its PID
  is recorded in a pid file.  ``stop_engine`` stops only that PID, and only while it is
  still a ``dockerd``.
- No registry can be reached here, so the base image for CPU builds is made locally:
  ``debootstrap --variant=minbase bookworm DIR`` then an import of the tree
  (``ensure_base_image``).
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlparse

from matrun.errors import EnvironmentBuildError, InputError

if TYPE_CHECKING:  # the Docker SDK is imported only when an engine is used
    import docker

DEFAULT_SOCKET = "/var/run/docker.sock"
BASE_IMAGE = "matrun-base:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DOCKERD_ARGS = ("--bridge=none", "--iptables=false")
ENGINE_START_TIMEOUT = 60.0
UNIX_PATH_MAX = 107  # bytes of a unix socket path (sun_path is 108 with the NUL)


class EngineUnavailable(EnvironmentBuildError):
    """No Docker engine answers (or the one named may not be used)."""


@dataclass(frozen=True)
class StartedEngine:
    """A dockerd this process started: its PID, socket, log and pid file."""

    pid: int
    socket: str
    log: Path
    pid_file: Path
    seconds: float  # from the start of dockerd until the socket answered


def engine_url(docker_host: str | None = None) -> str:
    """The engine address to use: ``docker_host``, else ``$DOCKER_HOST``, else the default socket.

    Raises ``InputError`` for an address that is not local (only unix sockets and loopback
    TCP are allowed: this tool never sends traffic to another host or a private network).
    """
    url = docker_host or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return url
    if parsed.scheme in ("tcp", "http", "https"):
        host = parsed.hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if loopback:
            return url
    raise InputError(
        f"Docker engine address {url!r} is not local; matrun only talks to a unix socket or "
        f"tcp://127.0.0.1 (unset DOCKER_HOST to use {DEFAULT_SOCKET})")


#: The API timeout of a client that builds images: committing a layer of a gigabyte or reading a
#: large image's attributes can keep a loaded engine from answering for longer than the usual
#: 10 s (seen on a 2-core host while tests ran beside the build: `images.get` after a finished
#: build timed out and the build was reported failed).
BUILD_TIMEOUT = 300.0


def connect(docker_host: str | None = None, *, timeout: float = 10.0) -> "docker.DockerClient":
    """A client of the local engine that answered a ping; ``EngineUnavailable`` otherwise."""
    url = engine_url(docker_host)
    parsed = urlparse(url)
    if parsed.scheme == "unix" and not Path(parsed.path).exists():  # asked before the SDK's slow import
        raise EngineUnavailable(f"no Docker engine: {parsed.path} does not exist "
                                "(start one with `dockerd --bridge=none --iptables=false`)")
    try:
        import docker
    except ImportError as exc:
        raise EngineUnavailable("the Docker SDK is not installed (pip install docker)") from exc
    try:
        client = docker.DockerClient(base_url=url, timeout=int(timeout))
        client.ping()
    except Exception as exc:  # the SDK raises several types for "nobody answers"
        raise EngineUnavailable(f"no Docker engine answers at {url}: {exc}") from exc
    return client


def find_engine(docker_host: str | None = None) -> "docker.DockerClient | None":
    """The local engine's client, or None when none answers (for ``--executor auto``)."""
    try:
        return connect(docker_host, timeout=5.0)
    except EngineUnavailable:
        return None


def start_engine(*, state_dir: Path, socket: str = DEFAULT_SOCKET, private: bool = False,
                 timeout: float = ENGINE_START_TIMEOUT) -> StartedEngine:
    """Start ``dockerd --bridge=none --iptables=false`` in its own session and wait for it.

    Only call this when the user asked for it (it needs root).  The PID goes to
    ``state_dir/dockerd.pid``, the log to ``state_dir/dockerd.log``.  Refuses when the socket
    already answers (an engine is running: use it).  ``private``: the engine keeps its images,
    state and pid file under ``state_dir`` (``--data-root``, ``--exec-root``, ``--pidfile``), so it
    can run beside the system's engine (used by the tests).
    """
    sockets = [socket] + ([str(state_dir.resolve() / "exec" / "containerd" / "containerd.sock.ttrpc")]
                          if private else [])
    too_long = [path for path in sockets if len(path.encode()) > UNIX_PATH_MAX]
    if too_long:  # dockerd would only say "timeout waiting for containerd to start"
        raise InputError(f"socket path {too_long[0]} is longer than {UNIX_PATH_MAX} bytes; "
                         "use a shorter state directory")
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineUnavailable("dockerd is not installed (Debian: apt-get install docker.io)")
    if find_engine(f"unix://{socket}") is not None:
        raise EngineUnavailable(f"a Docker engine already answers at {socket}; use it")
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "dockerd.log"
    pid_file = state_dir / "dockerd.pid"
    args = [dockerd, *DOCKERD_ARGS, f"--host=unix://{socket}"]
    if private:
        args += [f"--data-root={state_dir / 'data'}", f"--exec-root={state_dir / 'exec'}",
                 f"--pidfile={state_dir / 'dockerd.engine.pid'}"]
    started = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)  # setsid: not killed with the terminal that started it
    pid_file.write_text(f"{proc.pid}\n")
    deadline = started + timeout
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            if private and _mounted(state_dir / "data"):
                # dockerd bind-mounts its data root and leaves it mounted when it fails early.
                subprocess.run(["umount", str(state_dir / "data")], check=False)
            raise EngineUnavailable(f"dockerd exited with {proc.returncode}; see {log}")
        if find_engine(f"unix://{socket}") is not None:
            return StartedEngine(proc.pid, socket, log, pid_file, time.perf_counter() - started)
        time.sleep(0.1)
    stop_engine(pid_file)  # ours, and of no use: do not leave it running
    raise EngineUnavailable(f"dockerd (pid {proc.pid}) did not answer on {socket} within "
                            f"{timeout:.0f} s and was stopped; see {log}")


def stop_engine(pid_file: Path, *, timeout: float = 30.0) -> bool:
    """Stop the dockerd whose PID ``start_engine`` recorded; True if it was running.

    Sends SIGTERM to that PID only, and only while /proc says it is still a dockerd
    (a recycled PID is left alone).
    """
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    if not _is_dockerd(pid):
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not _exited(pid):
        time.sleep(0.1)
    pid_file.unlink(missing_ok=True)
    return True


def _mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point, bind mounts included (``os.path.ismount`` misses a
    bind mount from the same file system)."""
    target = str(path.resolve())
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    # Fields are octal-escaped: a space is \040.
    return any(line.split()[1].encode().decode("unicode_escape") == target for line in lines if line.split())


def _exited(pid: int) -> bool:
    """True once the process has exited.  When this process started it, it is reaped here
    (a dockerd's main thread shows as a zombie while its other threads still shut down, so
    the zombie state alone does not mean it is gone)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:  # not our child: its parent reaps it
        return not _is_dockerd(pid)


def _is_dockerd(pid: int) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return comm == "dockerd" and state != "Z"


@contextmanager
def build_lock(client: "docker.DockerClient") -> Iterator[None]:
    """Hold the build lock of the engine ``client`` talks to, for the block.

    Builds on one engine take turns, whoever starts them (two `matrun build`, a sweep that
    builds, parallel test workers): a build prunes the untagged build stages it leaves
    (``builds.remove_build_stages``), which would remove another build's stage before its
    ``COPY --from``; and an image missing when two processes looked is built once, by the
    first, the second finding it (the check is made again under the lock).  The lock is a
    ``flock`` on a file in the temporary directory named by the engine's address, so every
    user of that engine on this host shares it; it is released when the process dies.
    """
    address = str(getattr(getattr(client, "api", None), "base_url", "") or "")
    digest = hashlib.sha256(address.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"matrun-build-{digest}.lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except PermissionError:  # made by another user: a read-only descriptor locks as well
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def ensure_base_image(client: "docker.DockerClient", name: str = BASE_IMAGE, *,
                      suite: str = DEBIAN_SUITE, mirror: str = DEBIAN_MIRROR,
                      workdir: Path | None = None) -> tuple[str, float | None]:
    """The base image's ID, made with debootstrap if the engine does not have it.

    Returns (image id, seconds it took to make, or None when it already existed).
    """
    import docker

    try:
        return client.images.get(name).id, None
    except docker.errors.ImageNotFound:
        pass
    with build_lock(client):  # another process may be making it: made once, then found
        try:
            return client.images.get(name).id, None
        except docker.errors.ImageNotFound:
            pass
        return _make_base_image(client, name, suite=suite, mirror=mirror, workdir=workdir)


def _make_base_image(client: "docker.DockerClient", name: str, *, suite: str, mirror: str,
                     workdir: Path | None) -> tuple[str, float]:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise EnvironmentBuildError(
            f"base image {name} is missing and debootstrap is not installed "
            "(Debian: apt-get install debootstrap), or pass another base image")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="matrun-debootstrap-", dir=workdir) as tmp:
        root = Path(tmp) / "root"
        done = subprocess.run(
            [debootstrap, "--variant=minbase", suite, str(root), mirror],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-2000:]
            raise EnvironmentBuildError(f"debootstrap {suite} failed (exit {done.returncode}):\n{tail}")
        # Downloaded .debs are not part of the system; keep them out of the image.
        for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        repository, _, tag = name.partition(":")
        try:
            client.api.import_image_from_stream(
                tar.stdout, repository=repository, tag=tag or "latest",
                changes=['CMD ["/bin/bash"]'])
        finally:
            tar.stdout.close()
            tar.wait()
        if tar.returncode != 0:
            raise EnvironmentBuildError(f"tar of the debootstrap tree failed (exit {tar.returncode})")
    return client.images.get(name).id, time.perf_counter() - started
