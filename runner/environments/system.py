"""The site's own Python: ``variant = "system"`` cells run in an interpreter matrun did not build.

Clusters and GPU hosts often have a Python with the framework already installed (a module
system, conda, a vendor's container).  A cell with ``variant = "system"`` and
``python = "/path/to/python"`` runs the harness in that interpreter with the local executor,
as asv's "existing" environments do.  What identifies it is what a probe of the interpreter
finds, never its path:

- ``probe_python`` runs the interpreter once (an argument list, never a shell; a timeout; the
  host's environment without ``PYTHON*`` / ``VIRTUAL_ENV*`` / ``CONDA*`` and ``-E -s``, as a
  cell sees it) with ``PROBE``, a standard-library script that reports the implementation and
  version, ``sys.prefix``, the directories of ``sys.path``, ``importlib.metadata``'s installed
  distributions (``name==version``) and whether each framework's modules can be found
  (``find_spec``: nothing is imported).  The script runs on any Python from 2.7, so that an old
  interpreter is refused by its version rather than by a traceback.
- The probe is cached under ``$MATRUN_HOME/system/`` per path, with the ``stat`` (device,
  inode, size, mtime) of the interpreter, of every directory on its ``sys.path`` and of its
  ``pyvenv.cfg``: planning stays fast, and a package installed or removed (its
  site-packages directory changes) is probed again.
- ``system_env_id``: ``<framework>-system-<hash>`` over the harness protocol, the
  implementation and full version, the real path of ``sys.prefix`` and the distributions —
  a different install is a different environment; the same install through two paths (a
  symlink) is the same one.
- ``system_refusal``: an interpreter older than ``MIN_PYTHON`` or without the framework's
  modules; ``executor_refusal``: any executor but the local one (docker and slurm's docker
  runtime run cells in images).
- ``list_system_envs``: the interpreters probed here, for ``matrun envs``.

Imports ``matrun.errors``, ``matrun.frameworks``, the harness's parameter declaration
(``SYSTEM_VARIANT``, ``show``) and ``home``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from matrun.errors import InputError
from matrun.frameworks import display_name, frameworks, get_framework
from matrun.runner.environments.home import HARNESS_PROTOCOL, matrun_home
from matrun.runner.harness.spec import SYSTEM_VARIANT, show

#: The oldest Python the harness runs on: pyproject.toml's ``requires-python``, the versions it
#: is tested on (its syntax needs 3.9; tests/test_system_python.py checks both).
MIN_PYTHON = (3, 10)
#: Seconds the probe may take (a conda environment of a thousand packages on NFS is slow).
PROBE_TIMEOUT_S = 60.0
#: At most this much of the probe's output is read.
MAX_PROBE_OUTPUT = 16 * 2**20
#: The bounds a probe's answer must keep (it comes from a program matrun did not write).
MAX_DISTRIBUTIONS = 100_000
MAX_TEXT = 4096
#: The probe's answer follows this line (whatever a sitecustomize printed before it is ignored).
MARK = "@@matrun-system-probe@@"
#: Bump when the cache's content changes.
CACHE_VERSION = 1
#: Variables of the host that would change what the interpreter finds (its own ``-E`` ignores
#: ``PYTHON*``); the local executor drops them from a cell's environment as well.
_DROP_PREFIXES = ("PYTHON", "VIRTUAL_ENV", "CONDA")

# Standard library only, and valid from Python 2.7 on: an old interpreter must answer with its
# version.  argv: the modules to look for.
PROBE = r'''
import json, os, platform, sys
out = {"implementation": platform.python_implementation(), "version": list(sys.version_info[:3]),
       "version_text": platform.python_version(), "build": sys.version, "executable": sys.executable,
       "prefix": os.path.realpath(sys.prefix),
       "base_prefix": os.path.realpath(getattr(sys, "base_prefix", sys.prefix)),
       "path": [os.path.realpath(p) for p in sys.path if p],
       "distributions": None, "modules": {}, "providers": {}}
try:
    from importlib import metadata
except ImportError:
    metadata = None
if metadata is not None:
    seen = set()
    for dist in metadata.distributions():
        try:
            name, version = dist.metadata["Name"], dist.version
        except Exception:
            continue
        if name and version:
            seen.add("%s==%s" % (name, version))
    out["distributions"] = sorted(seen, key=lambda d: (d.lower(), d))
    try:
        providers = metadata.packages_distributions()
    except Exception:
        providers = {}
    out["providers"] = dict((m, sorted(set(providers.get(m, [])))) for m in sys.argv[1:])
for name in sys.argv[1:]:
    try:
        import importlib.util
        out["modules"][name] = importlib.util.find_spec(name) is not None
    except Exception:
        out["modules"][name] = False
sys.stdout.write("\n@@matrun-system-probe@@\n" + json.dumps(out) + "\n")
'''


@dataclass(frozen=True)
class SiteProbe:
    """What ``PROBE`` found in one interpreter (``path``, as the matrix names it)."""

    path: str
    implementation: str
    version: tuple[int, ...]
    version_text: str
    build: str
    executable: str
    prefix: str
    base_prefix: str
    sys_path: tuple[str, ...]
    # "name==version", sorted; None where the interpreter has no importlib.metadata (< 3.8)
    distributions: tuple[str, ...] | None
    modules: Mapping[str, bool]
    providers: Mapping[str, tuple[str, ...]]

    @property
    def identity_text(self) -> str:
        """What the environment id hashes: the install, not the path that reached it."""
        dists = "\n".join(self.distributions) if self.distributions is not None else "distributions unknown"
        return (f"system\n{HARNESS_PROTOCOL}\n{self.implementation} {self.build}\nprefix {self.prefix}\n"
                f"{dists}")

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.identity_text.encode("utf-8", "surrogatepass")).hexdigest()[:12]

    def env_id(self, framework: str) -> str:
        return f"{framework}-{SYSTEM_VARIANT}-{self.digest}"

    @property
    def too_old(self) -> bool:
        return tuple(self.version[:2]) < MIN_PYTHON

    def version_of(self, module: str) -> str:
        """``name==version`` of the distribution that provides ``module``, or ""."""
        names = {n.lower() for n in self.providers.get(module, ())} or {module.lower()}
        for dist in self.distributions or ():
            name, _, version = dist.partition("==")
            if name.lower() in names or name.lower().replace("_", "-") in names:
                return f"{name}=={version}"
        return ""

    def describe(self) -> str:
        return f"{self.implementation} {self.version_text} at {self.prefix}"


def framework_modules(framework: str) -> tuple[str, ...]:
    """The top-level modules the framework's ``import_check`` imports, less the standard
    library's (framework.toml is the only source: no framework is named here)."""
    return _modules_of(get_framework(framework).import_check)


@functools.cache
def _modules_of(code: str) -> tuple[str, ...]:
    found: dict[str, None] = {}
    for node in ast.walk(ast.parse(code)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                 else [])
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top != "__future__":
                found[top] = None
    return tuple(found)


def _all_modules() -> tuple[str, ...]:
    """Every framework's modules: one probe answers for any framework a cell names."""
    return tuple(sorted({m for name in frameworks() for m in framework_modules(name)}))


# --- the probe and its cache -------------------------------------------------------------


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _interpreter_key(path: str) -> list[Any]:
    """The interpreter as the file system has it now: the file and, for a link, the link."""
    try:
        link = os.lstat(path)
        own = [link.st_dev, link.st_ino, link.st_mtime_ns]
    except (OSError, ValueError):
        own = None
    return [_stat(path), own]


def _watched(probe: SiteProbe) -> list[str]:
    """What a change of the install changes: the directories of its ``sys.path`` (pip adds and
    removes ``*.dist-info`` there) and its ``pyvenv.cfg`` (system site packages on or off)."""
    return sorted({*probe.sys_path, os.path.join(probe.prefix, "pyvenv.cfg")})


def _cache_file(path: str) -> Path:
    name = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return matrun_home() / "system" / f"{name}.json"


_MEMO: dict[str, tuple[list[Any], dict[str, Any], SiteProbe]] = {}


def probe_python(path: str) -> SiteProbe:
    """What ``path`` is: from the cache while the interpreter and its ``sys.path`` are
    unchanged and the probe covers every framework's modules, else probed now (and cached).
    Raises ``InputError`` (exit 2) naming ``python`` when it cannot be probed."""
    key = _interpreter_key(path)
    if key[0] is None:
        raise InputError(f"{_named(path)}: no such file, or it cannot be read")
    wanted = set(_all_modules())
    held = _MEMO.get(path) or _read_cache(path)
    if held is not None:
        old_key, files, probe = held
        if old_key == key and wanted <= set(probe.modules) and all(_stat(f) == s for f, s in files.items()):
            _MEMO[path] = held
            return probe
    probe = _run_probe(path, sorted(wanted))
    files = {f: _stat(f) for f in _watched(probe)}
    _MEMO[path] = (key, files, probe)
    _write_cache(path, key, files, probe)
    return probe


def _run_probe(path: str, modules: list[str]) -> SiteProbe:
    """Run ``PROBE`` in ``path``: its own session (a timeout kills whatever it started), its
    output into files read up to ``MAX_PROBE_OUTPUT``, never a pipe a child could hold open."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES)}
    where = _named(path)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([path, "-E", "-s", "-c", PROBE, *modules], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, cwd="/", env=environ, start_new_session=True)
        except OSError as exc:
            raise InputError(f"{where}: cannot be run: {exc.strerror or exc}") from None
        try:
            code = proc.wait(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise InputError(f"{where}: its probe did not answer within {PROBE_TIMEOUT_S:g} s; is it a "
                             "Python interpreter?") from None
        out.seek(0)
        err.seek(0, os.SEEK_END)
        err.seek(max(0, err.tell() - 2000))
        text = out.read(MAX_PROBE_OUTPUT).decode("utf-8", "replace")
        said = err.read().decode("utf-8", "replace").strip().splitlines()[-3:]
    if code != 0 or MARK not in text:
        detail = f": {' / '.join(said)}" if said else ""
        raise InputError(f"{where}: not a Python interpreter matrun can probe (exit {code}){detail}")
    try:
        return _parse(path, json.loads(text.rsplit(MARK, 1)[1]))
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f"{where}: its probe answered with something matrun cannot read ({exc})") from None


def _kill_session(proc: subprocess.Popen) -> None:
    """Kill the probe's session while its leader is still unreaped (its id cannot be reused)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _named(path: Any) -> str:
    """``python = "<path>"`` for messages: in full (the matrix's check bounds it and refuses
    control characters), anything else as ``show`` spells it."""
    if isinstance(path, str) and len(path) <= MAX_TEXT and path.isprintable():
        return f'python = "{path}"'
    return f"python = {show(path)}"


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"expected a string of at most {MAX_TEXT} characters, got {show(value)}")
    return value


def _parse(path: str, doc: Any) -> SiteProbe:
    """The probe's answer, checked: it comes from a program matrun did not write."""
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    version = doc["version"]
    if (not isinstance(version, list) or not 1 <= len(version) <= 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10_000 for v in version)):
        raise ValueError(f"version {show(version)}")
    dists = doc["distributions"]
    if dists is not None:
        if not isinstance(dists, list) or len(dists) > MAX_DISTRIBUTIONS:
            raise ValueError("distributions: expected a list")
        dists = tuple(_text(d) for d in dists)
    paths, modules, providers = doc["path"], doc["modules"], doc["providers"]
    if not isinstance(paths, list) or len(paths) > 10_000 or not isinstance(modules, dict) \
            or not isinstance(providers, dict):
        raise ValueError("path, modules, providers")
    return SiteProbe(
        path=path, implementation=_text(doc["implementation"]), version=tuple(version),
        version_text=_text(doc["version_text"]), build=_text(doc["build"]), executable=_text(doc["executable"]),
        prefix=_text(doc["prefix"]), base_prefix=_text(doc["base_prefix"]),
        sys_path=tuple(_text(p) for p in paths), distributions=dists,
        modules={_text(k): bool(v) for k, v in modules.items()},
        providers={_text(k): tuple(_text(n) for n in v) for k, v in providers.items() if isinstance(v, list)},
    )


def _read_cache(path: str) -> tuple[list[Any], dict[str, Any], SiteProbe] | None:
    try:
        doc = json.loads(_cache_file(path).read_text(encoding="utf-8"))
        files = doc.get("files")
        if (doc.get("cache_version") != CACHE_VERSION or doc.get("path") != path or not isinstance(files, dict)
                or not all(isinstance(f, str) for f in files)):
            return None
        return doc["interpreter"], files, _parse(path, doc["probe"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # missing or damaged: probed again


def _write_cache(path: str, key: list[Any], files: dict[str, Any], probe: SiteProbe) -> None:
    target = _cache_file(path)
    doc = {"cache_version": CACHE_VERSION, "path": path, "interpreter": key, "files": files, "probe": {
        "implementation": probe.implementation, "version": list(probe.version),
        "version_text": probe.version_text, "build": probe.build, "executable": probe.executable,
        "prefix": probe.prefix, "base_prefix": probe.base_prefix, "path": list(probe.sys_path),
        "distributions": None if probe.distributions is None else list(probe.distributions),
        "modules": dict(probe.modules), "providers": {k: list(v) for k, v in probe.providers.items()}}}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        pass  # a cache only: the next plan probes again


# --- what the planner and the executors ask ----------------------------------------------


def system_env_id(framework: str, python: str) -> str:
    """The environment id of a ``variant = "system"`` cell of ``framework`` in ``python``."""
    return probe_python(python).env_id(framework)


def system_refusal(framework: str, python: str) -> str | None:
    """Why ``python`` cannot run the framework's cells (too old, the framework missing), or None."""
    probe = probe_python(python)
    where = f"{_named(python)} ({probe.describe()})"
    if probe.too_old:
        return (f"{where}: the harness needs Python {'.'.join(map(str, MIN_PYTHON))} or later; name a newer "
                "interpreter")
    missing = [m for m in framework_modules(framework) if not probe.modules.get(m)]
    if missing:
        return (f"{where} cannot import {', '.join(missing)}: {display_name(framework)} is not installed "
                "there; install it into that interpreter, or name one that has it")
    return None


def executor_refusal(params: Mapping[str, Any], executor: str) -> str | None:
    """Why ``executor`` cannot run a ``variant = "system"`` cell (only the local executor
    runs the site's own Python), or None."""
    if params.get("variant") != SYSTEM_VARIANT or executor == "local":
        return None
    return (f"variant = \"system\" runs in the site's own Python ({_named(params.get('python'))}) "
            f"with the local executor only; the {executor} executor runs cells in the images matrun "
            "builds: use --executor local (under Slurm: [slurm] runtime = \"local\")")


def list_system_envs() -> list[dict[str, str]]:
    """The interpreters probed here (their cache) that are still there, one row per framework
    they can import: ``env_id``, ``framework``, ``variant``, ``framework_version``, ``python``,
    ``path``."""
    root = matrun_home() / "system"
    rows = []
    for entry in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            path = json.loads(entry.read_text(encoding="utf-8"))["path"]
            probe = probe_python(path)
        except (OSError, ValueError, TypeError, KeyError, InputError):
            continue  # gone, or no longer an interpreter
        for name in frameworks():
            modules = framework_modules(name)
            if modules and all(probe.modules.get(m) for m in modules) and not probe.too_old:
                rows.append({"env_id": probe.env_id(name), "framework": name, "variant": SYSTEM_VARIANT,
                             "framework_version": probe.version_of(modules[0]).partition("==")[2],
                             "python": probe.version_text, "path": path})
    return rows
