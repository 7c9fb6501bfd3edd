"""Framework releases as environments: a cell's ``version`` resolved once and locked with hashes.

A cell that names ``version = "2.4.1"`` runs in an environment of that release of its
framework.  Its requirements are the framework's ``[releases] requires`` with the release put
in (framework.toml; docs/RELEASES.md): pip's own resolver chooses everything they pull in,
once (``pip install --dry-run --report``, for this Python on this platform), and what it chose
is kept as a lock, each file with its SHA-256, under ``$MATRUN_HOME/locks/``.  The environment
is built from the lock alone (``pip install --no-deps --require-hashes``), its id hashes the
lock, and every run of it records the lock (``records.py``): the same cell re-planned next
month builds the same environment, whatever the index has gained since.

A release pip cannot find (a typo, a release with no build for this Python) or requirements
it cannot satisfy together are refused when the cell is planned, with pip's reason and the
nearest releases it offers.  ``matrun envs --relock`` resolves a release again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from matrun.errors import InputError
from matrun.frameworks import display_name, get_framework, release_key
from matrun.runner.environments.home import matrun_home

#: How a release travels where the executors expect a variant name: ``cpu@2.4.1``.  A variant
#: name never holds ``@`` (spec.py ``_VARIANT``), so the two never meet.
SEPARATOR = "@"
LOCK_FORMAT = 1
RESOLVE_TIMEOUT_S = 900


def env_variant(params: dict) -> str:
    """The environment key of a cell: its variant, or ``variant@version`` for a release cell."""
    version = params.get("version") or ""
    return f"{params['variant']}{SEPARATOR}{version}" if version else params["variant"]


def split_variant(key: str) -> tuple[str, str]:
    """``cpu@2.4.1`` -> ("cpu", "2.4.1"); ``cpu`` -> ("cpu", "")."""
    variant, _, version = key.partition(SEPARATOR)
    return variant, version


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str


@dataclass(frozen=True)
class Lock:
    """What pip chose for one release: the pins (each with its file's SHA-256) and how they
    were asked for."""

    framework: str
    variant: str
    version: str
    requested: tuple[str, ...]
    pins: tuple[Pin, ...]
    python: str
    platform: str
    pip: str = ""
    path: Path | None = None

    @property
    def text(self) -> str:
        """The lock as a pip requirements file (``--require-hashes``): what the environment is
        built from, and what its id hashes.  Deterministic: no dates, no pip version."""
        head = (f"# matrun lock: {self.framework} {self.version} (variant {self.variant}) for Python "
                f"{self.python} on {self.platform}\n# requested: {' '.join(self.requested)}\n")
        return head + "".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in self.pins)

    def pinned(self, name: str) -> str | None:
        wanted = project_name(name)
        return next((p.version for p in self.pins if project_name(p.name) == wanted), None)

    def as_json(self) -> dict:
        return {"format": LOCK_FORMAT, "framework": self.framework, "variant": self.variant,
                "version": self.version, "requested": list(self.requested), "python": self.python,
                "platform": self.platform, "pip": self.pip,
                "pins": [{"name": p.name, "version": p.version, "sha256": p.sha256} for p in self.pins]}


def project_name(name: str) -> str:
    """A project's name as the index compares names (PEP 503: ``Jinja2`` = ``jinja2``, ``_`` = ``-``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def platform_tag() -> str:
    return f"{sys.platform} {platform.machine()}"


def requirements_of(framework: str, variant: str, version: str) -> list[str]:
    rel = get_framework(framework).releases
    if rel is None:
        raise InputError(f'version "{version}": {display_name(framework)} has no releases matrun can install here')
    return rel.requirements(version)


def lock_path(framework: str, variant: str, version: str, requested: list[str]) -> Path:
    key = hashlib.sha256("\n".join([python_tag(), platform_tag(), *requested]).encode()).hexdigest()[:12]
    return matrun_home() / "locks" / f"{framework}-{variant}-{version}-{key}.json"


def load_lock(path: Path) -> Lock | None:
    """A lock written before, or None (missing, or unreadable: resolved again)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != LOCK_FORMAT:
            return None
        pins = tuple(Pin(p["name"], p["version"], p["sha256"]) for p in doc["pins"])
        if not pins or not all(re.fullmatch(r"[0-9a-f]{64}", p.sha256) for p in pins):
            return None
        return Lock(doc["framework"], doc["variant"], doc["version"], tuple(doc["requested"]), pins,
                    doc["python"], doc["platform"], doc.get("pip", ""), path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lock_for(framework: str, variant: str, version: str, *, relock: bool = False,
             log: Callable[[str], None] | None = None,
             resolver: Callable[[list[str]], dict] | None = None,
             offered: Callable[[str], list[str]] | None = None) -> Lock:
    """The lock of a release, resolving it the first time (or with ``relock``).

    ``InputError`` naming ``version`` when pip cannot resolve it (with pip's reason and the
    nearest releases it offers).  ``resolver``: requirements -> pip's installation report;
    ``offered``: framework -> the releases the index offers (tests; default: ``pip_report``,
    ``offered_releases``)."""
    requested = requirements_of(framework, variant, version)
    path = lock_path(framework, variant, version, requested)
    if not relock:
        found = load_lock(path)
        if found is not None:
            return found
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # another matrun may be resolving the same release
        found = None if relock else load_lock(path)
        if found is not None:
            return found
        if log:
            log(f"resolving {framework} {version} ({' '.join(requested)}) with pip, once")
        try:
            report = (resolver or pip_report)(requested)
        except InputError as exc:
            raise InputError(f'version "{version}" of {framework}: '
                             f'{_not_offered(framework, version, offered) or exc}') from None
        lock = _lock_from_report(framework, variant, version, requested, report)
        rel = get_framework(framework).releases
        if rel is not None and lock.pinned(rel.package) is None:
            raise InputError(f'version "{version}" of {framework}: pip\'s resolution holds no {rel.package}')
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(lock.as_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # readers see the old lock or the new one, never half of one
        return replace(lock, path=path)


def check_releases(cells: Iterable[Mapping[str, Any]], *, log: Callable[[str], None] | None = None) -> None:
    """Resolve the lock of every release the cells name (each once; a lock resolved before is
    read from disk), so that a release pip cannot install is refused, by name, before anything
    is built or run: ``InputError`` naming ``version``."""
    for framework, variant, version in sorted({(c["framework"], c["variant"], c["version"])
                                               for c in cells if c.get("version")}):
        lock_for(framework, variant, version, log=log)


def _not_offered(framework: str, version: str, offered: Callable[[str], list[str]] | None) -> str | None:
    """Why pip found no ``version``, when the index does not offer it for this Python (with the
    nearest releases it does offer), or None (it is offered: the reason is another)."""
    try:
        releases = (offered or offered_releases)(framework)
    except InputError:
        return None
    if any(release_key(v) == release_key(version) for v in releases):
        return None
    package = get_framework(framework).releases.package
    where = f"for Python {python_tag()} on {platform_tag()}"
    if not releases:
        return f"the package index offers no release of {package} {where}"
    return (f"the package index offers no {package} {version} {where}; nearest: "
            f"{', '.join(nearest(version, releases))} ({len(releases)} releases offered, "
            f"{releases[0]} to {releases[-1]})")


def _lock_from_report(framework: str, variant: str, version: str, requested: list[str], report: dict) -> Lock:
    pins = []
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        hashes = ((item.get("download_info") or {}).get("archive_info") or {}).get("hashes") or {}
        if "sha256" not in hashes:
            raise InputError(f"pip resolved {meta.get('name')} {meta.get('version')} from a source with no "
                             "SHA-256 (a directory or a VCS checkout): a release environment is built from "
                             "files only")
        pins.append(Pin(meta["name"], meta["version"], hashes["sha256"]))
    if not pins:
        raise InputError("pip's resolution installs nothing")
    pins.sort(key=lambda p: project_name(p.name))
    return Lock(framework, variant, version, tuple(requested), tuple(pins), python_tag(), platform_tag(),
                str(report.get("pip_version", "")))


def pip_report(requested: list[str]) -> dict:
    """pip's installation report for ``requested`` in a fresh environment of this Python
    (``--dry-run --ignore-installed``: nothing is installed).  ``InputError`` with pip's
    reason when it cannot resolve them."""
    with tempfile.TemporaryDirectory(prefix="matrun-resolve-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--disable-pip-version-check", "--no-input", "--report", str(out), *requested]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise InputError(f"pip did not resolve {' '.join(requested)} within {RESOLVE_TIMEOUT_S} s") from None
        except OSError as exc:
            raise InputError(f"could not run pip to resolve {' '.join(requested)}: {exc}") from None
        if proc.returncode != 0 or not out.is_file():
            raise InputError(pip_failure(proc.stdout + proc.stderr, requested))
        return json.loads(out.read_text(encoding="utf-8"))


def pip_failure(output: str, requested: list[str]) -> str:
    """pip's reason in a sentence: requirements that conflict (pip's own explanation: "the
    conflict is caused by ..."), or pip's last error lines."""
    lines = [ln.strip() for ln in output.splitlines()
             if ln.strip() and not ln.startswith(("WARNING: Location", "Looking in", "Collecting", "Downloading",
                                                  "Requirement already", "Using cached", "  "))]
    if "conflict is caused by" in output:
        cause, take = [], False
        for ln in output.splitlines():
            if "conflict is caused by" in ln:
                take = True
                continue
            if take and ln.strip():
                if ln.startswith(("To fix", "ERROR")) or ln.strip().startswith("Additionally"):
                    break
                cause.append(ln.strip())
        if cause:
            return f"the requirements {' '.join(requested)} conflict: " + "; ".join(cause)
    errors = [ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR")]
    return "pip could not resolve " + " ".join(requested) + ": " + " ".join((errors or lines)[-3:])


def nearest(version: str, offered: list[str], n: int = 3) -> list[str]:
    """The ``n`` offered releases closest to ``version``: the ones just below and above it in
    release order (the same major.minor first)."""
    try:
        key = release_key(version)
    except ValueError:
        return offered[-n:]
    keyed = []
    for v in offered:
        try:
            keyed.append((release_key(v), v))
        except ValueError:
            continue
    keyed.sort()
    below = [v for k, v in keyed if k < key]
    above = [v for k, v in keyed if k > key]
    out: list[str] = []
    while len(out) < n and (below or above):
        if below:
            out.append(below.pop())
        if above and len(out) < n:
            out.append(above.pop(0))
    return sorted(out, key=release_key)


def offered_releases(framework: str) -> list[str]:
    """The releases of the framework's package that pip offers for this Python, oldest first
    (``pip index versions``), for ``matrun bisect`` to choose among."""
    rel = get_framework(framework).releases
    if rel is None:
        raise InputError(f"{display_name(framework)} has no releases matrun can install here")
    cmd = [sys.executable, "-m", "pip", "index", "versions", rel.package, "--disable-pip-version-check", "--no-input"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"could not ask pip for the releases of {rel.package}: {exc}") from None
    found = re.search(r"Available versions: (.*)", proc.stdout)
    if proc.returncode != 0 or not found:
        raise InputError(f"pip lists no releases of {rel.package}: {(proc.stdout + proc.stderr).strip()[-300:]}")
    out = []
    for v in found.group(1).split(","):
        v = v.strip()
        try:
            release_key(v)
        except ValueError:
            continue  # a local label (2.13.0+cpu): the same release as 2.13.0
        out.append(v)
    return sorted(set(out), key=release_key)
