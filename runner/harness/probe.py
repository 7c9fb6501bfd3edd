"""What is really in force in this process, as far as the standard library can tell.

The framework's own view (its version, build, thread counts, switches) comes from the
adapter's ``probe``; ``collect`` merges the two into the ``probe`` event.  Everything here
fails soft: what cannot be read is left out, never an error.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .cpusets import format_cpuset, parse_cpuset
from .distributed import single_process_env
from .spec import SYSTEM_VARIANT

# Basename prefixes of the math and threading libraries worth reporting.
LIBRARY_PREFIXES = ("libmkl", "libiomp", "libgomp", "libomp", "libopenblas", "libblis",
                    "libblas", "libdnnl", "libmkldnn")


def affinity() -> list[int]:
    """CPU ids this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def thread_census() -> dict[str, int]:
    """Threads of this process by name (``/proc/self/task/*/comm``): how adapters count the
    pools a framework starts (TensorFlow's inter-op pool ``tf_Compute``, XLA's CPU pool
    ``tf_XLAEigen``)."""
    counts: collections.Counter[str] = collections.Counter()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as fh:
                counts[fh.read().strip()] += 1
        except OSError:
            continue
    return dict(sorted(counts.items()))


def loaded_libraries(maps: str = "/proc/self/maps") -> list[dict[str, Any]]:
    """BLAS / OpenMP / oneDNN / MKL shared libraries mapped into this process, in load order."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].strip()
        name = os.path.basename(path)
        if name.startswith(LIBRARY_PREFIXES) and ".so" in name and path not in found:
            found[path] = {"name": name, "path": path}
    return list(found.values())


def threadpools() -> list[dict[str, Any]]:
    """``threadpoolctl.threadpool_info()`` when threadpoolctl is importable, else []."""
    try:
        from threadpoolctl import threadpool_info

        return [dict(info) for info in threadpool_info()]
    except Exception:  # fail soft: an old or broken threadpoolctl must not stop the run
        return []


def libraries() -> list[dict[str, Any]]:
    """``loaded_libraries`` with the version and thread count threadpoolctl knows, if any."""
    libs = loaded_libraries()
    by_path = {os.path.realpath(lib["path"]): lib for lib in libs}
    for pool in threadpools():
        path = pool.get("filepath") or ""
        lib = by_path.get(os.path.realpath(path)) if path else None
        if lib is None and path:
            lib = {"name": os.path.basename(path), "path": path}
            libs.append(lib)
            by_path[os.path.realpath(path)] = lib
        if lib is None:
            continue
        if pool.get("version"):
            lib["version"] = pool["version"]
        if pool.get("num_threads") is not None:
            lib["threads"] = pool["num_threads"]
        for key in ("user_api", "internal_api"):
            if pool.get(key):
                lib[key] = pool[key]
    return libs


# --- the BLAS actually loaded -------------------------------------------------------------
#
# Debian's frameworks (python3-torch) link libblas.so.3 / liblapack.so.3, which are
# alternatives: /usr/lib/<triplet>/libblas.so.3 -> /etc/alternatives/libblas.so.3-<triplet>
# -> e.g. /usr/lib/<triplet>/openblas-pthread/libblas.so.3.  The kernel names a mapping by
# the file it really opened, so /proc/self/maps shows the provider's own path; symlinks are
# resolved all the same (a test tree, or a kernel that names a link).  The provider is told
# by the library's own entry points where it can be asked (OpenBLAS, BLIS, MKL), else by
# where the file lives (Debian's netlib reference BLAS: .../blas/libblas.so.3).

# Basenames (lower case) of BLAS and LAPACK libraries; ``libcblas`` is ATLAS's or netlib's CBLAS.
BLAS_NAME_PREFIXES = ("libblas.so", "libopenblas", "libblis", "libmkl_rt", "libmkl_core", "libflexiblas",
                      "libcblas.so", "libsatlas", "libtatlas", "libatlas")
LAPACK_NAME_PREFIXES = ("liblapack.so",)
# Path parts of BLAS copies that numpy / scipy wheels bundle for themselves (not a framework's).
BUNDLED_FOR_NUMPY = ("numpy.libs", "scipy.libs", "scipy_openblas", "numpy/.libs", "scipy/.libs")
THREADINGS = ("pthread", "openmp", "serial")


def mapped_files(maps: str = "/proc/self/maps") -> list[dict[str, Any]]:
    """File-backed mappings of this process, one entry per path in maps order:
    ``{"path", "deleted"}``; a path may hold spaces; `` (deleted)`` marks an unlinked file."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    return parse_maps(text)


def parse_maps(text: str) -> list[dict[str, Any]]:
    """``mapped_files`` of the text of a maps file (address perms offset dev inode path)."""
    seen: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].rstrip("\n")
        if not path.startswith("/"):
            continue  # [heap], [stack], [vdso], anonymous
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[:-len(" (deleted)")]
        if path not in seen:
            seen[path] = {"path": path, "deleted": deleted}
    return list(seen.values())


def _kind(path: str) -> str | None:
    name = os.path.basename(path).lower()
    if ".so" not in name:
        return None
    if name.startswith(LAPACK_NAME_PREFIXES):
        return "lapack"
    if name.startswith(BLAS_NAME_PREFIXES):
        return "blas"
    return None


def bundled_for_numpy(path: str) -> bool:
    """A BLAS that a numpy / scipy wheel carries for itself (``numpy.libs/libscipy_openblas…``)."""
    return any(part in path for part in BUNDLED_FOR_NUMPY)


def provider_from_path(path: str) -> tuple[str, str | None]:
    """(provider, threading) as far as a library's resolved path tells: ``openblas``, ``blis``,
    ``mkl``, ``flexiblas``, ``atlas``, ``reference`` (Debian's netlib ``…/blas/libblas.so.3``
    or ``…/lapack/liblapack.so.3``) or ``unknown``; threading ``pthread`` / ``openmp`` /
    ``serial`` where the Debian directory (``openblas-pthread``) or name (``libopenblasp``) says."""
    folder = os.path.basename(os.path.dirname(path)).lower()
    name = os.path.basename(path).lower()
    threading = None
    for key in THREADINGS:
        if folder.endswith("-" + key):
            threading = key
    for provider in ("openblas", "blis", "flexiblas", "atlas"):
        if provider in name or provider in folder:
            if provider == "openblas" and threading is None and re.match(r"libopenblas[po][-_.]", name):
                threading = "pthread" if name[len("libopenblas")] == "p" else "openmp"
            return provider, threading
    if name.startswith("libmkl"):
        return "mkl", threading
    if (folder, name.split(".so")[0]) in (("blas", "libblas"), ("lapack", "liblapack")):
        return "reference", None
    return "unknown", threading


def resolve_links(path: str, *, limit: int = 16) -> list[str]:
    """``path`` and each symlink hop after it (``[link, /etc/alternatives/…, target]``); stops
    at a missing file, a loop or ``limit`` hops.  Never raises."""
    chain = [path]
    current = path
    for _ in range(limit):
        try:
            if not os.path.islink(current):
                break
            target = os.readlink(current)
        except OSError:
            break
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
        if current in chain:
            break
        chain.append(current)
    return chain


def _realpath(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def alternatives(admin_dir: str = "/var/lib/dpkg/alternatives") -> list[dict[str, Any]]:
    """Debian alternatives for BLAS / LAPACK: ``{"name", "mode", "link", "chain", "value"}``.

    ``update-alternatives`` keeps one file per alternative: its mode (auto / manual), then
    the link it manages (``/usr/lib/<triplet>/libblas.so.3``); the link is followed through
    ``/etc/alternatives`` to ``value``, the file a program that links the name really loads.
    """
    found = []
    try:
        names = sorted(os.listdir(admin_dir))
    except OSError:
        return []
    for name in names:
        if not name.startswith(("libblas.so", "liblapack.so", "libcblas.so")):
            continue
        try:
            with open(os.path.join(admin_dir, name), encoding="utf-8", errors="replace") as fh:
                head = [fh.readline().strip() for _ in range(2)]
        except OSError:
            continue
        if not head[1].startswith("/"):
            continue
        chain = resolve_links(head[1])
        found.append({"name": name, "mode": head[0] or None, "link": head[1], "chain": chain,
                      "value": _realpath(head[1])})
    return found


def dpkg_owner(path: str, dpkg_dir: str = "/var/lib/dpkg") -> dict[str, str] | None:
    """``{"name", "version"}`` of the Debian package that installed ``path`` (from dpkg's
    file lists and status file), or None."""
    info = os.path.join(dpkg_dir, "info")
    try:
        lists = sorted(f for f in os.listdir(info) if f.endswith(".list"))
    except OSError:
        return None
    # The file list names /usr/lib/… where the kernel does too (merged /usr); try both spellings.
    wanted = {path, path[len("/usr"):] if path.startswith("/usr/lib/") else "/usr" + path}
    owner = None
    for listing in lists:
        try:
            with open(os.path.join(info, listing), encoding="utf-8", errors="replace") as fh:
                if any(line.rstrip("\n") in wanted for line in fh):
                    owner = listing[:-len(".list")].split(":")[0]
                    break
        except OSError:
            continue
    if owner is None:
        return None
    version = None
    try:
        with open(os.path.join(dpkg_dir, "status"), encoding="utf-8", errors="replace") as fh:
            current = None
            for line in fh:
                if line.startswith("Package: "):
                    current = line[len("Package: "):].strip()
                elif current == owner and line.startswith("Version: "):
                    version = line[len("Version: "):].strip()
                    break
    except OSError:
        pass
    return {"name": owner, "version": version} if version else {"name": owner}


def upstream_version(debian_version: str) -> str:
    """``3.11.0`` of ``3.11.0-2``, ``0.3.21`` of ``0.3.21+ds-4``, ``1.24.2`` of ``1:1.24.2-1+deb12u1``."""
    version = debian_version.split(":", 1)[-1]
    version = version.rsplit("-", 1)[0] if "-" in version else version
    return re.split(r"[+~]", version, maxsplit=1)[0]


def ask_library(path: str) -> dict[str, Any]:
    """What an already loaded library says about itself: ``provider`` and ``version`` (and
    OpenBLAS's ``config`` / ``corename`` / ``parallel``), from OpenBLAS's ``openblas_get_config``,
    BLIS's ``bli_info_get_version_str`` or MKL's ``mkl_get_version_string``; ``defined_in``: the
    file that defines the entry point (``dladdr``), which may be a dependency of ``path``
    (a symbol lookup through a handle searches the library's dependencies too).  Loads
    nothing (``RTLD_NOLOAD``): a library that is not mapped already gives {}.  Never raises."""
    try:
        import ctypes

        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except Exception:
        return {}

    def text(name: str) -> str:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        return (fn() or b"").decode("ascii", "replace").strip()

    out: dict[str, Any] = {}
    try:
        if hasattr(lib, "openblas_get_config"):
            entry = "openblas_get_config"
            out = {"provider": "openblas", "config": text(entry)}
            match = re.search(r"OpenBLAS\s+(\d[\w.]*)", out["config"])
            if match:
                out["version"] = match.group(1)
            if hasattr(lib, "openblas_get_corename"):
                out["corename"] = text("openblas_get_corename")
            if hasattr(lib, "openblas_get_parallel"):
                lib.openblas_get_parallel.restype, lib.openblas_get_parallel.argtypes = ctypes.c_int, []
                out["parallel"] = {0: "serial", 1: "pthread", 2: "openmp"}.get(lib.openblas_get_parallel())
        elif hasattr(lib, "bli_info_get_version_str"):
            entry = "bli_info_get_version_str"
            out = {"provider": "blis", "version": text(entry)}
        elif hasattr(lib, "mkl_get_version_string"):
            entry = "mkl_get_version_string"
            buf = ctypes.create_string_buffer(256)
            lib.mkl_get_version_string.restype = None
            lib.mkl_get_version_string.argtypes = [ctypes.c_char_p, ctypes.c_int]
            lib.mkl_get_version_string(buf, len(buf))
            out = {"provider": "mkl", "config": buf.value.decode("ascii", "replace").strip()}
            match = re.search(r"(\d{4}(?:\.\d+)*)", out["config"])
            if match:
                out["version"] = match.group(1)
        else:
            return {}
        defined_in = _defined_in(ctypes, getattr(lib, entry))
        if defined_in:
            out["defined_in"] = defined_in
    except Exception:  # fail soft: a library that does not answer as expected is left unasked
        return out
    return out


def _defined_in(ctypes: Any, fn: Any) -> str | None:
    """The resolved path of the shared object that holds function ``fn`` (glibc ``dladdr``)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.restype, dladdr.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        info = DlInfo()
        if not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
            return None
        return _realpath(os.fsdecode(info.dli_fname))
    except Exception:
        return None


def describe_library(entry: dict[str, Any], alts: list[dict[str, Any]], *, dpkg_dir: str = "/var/lib/dpkg",
                     ask: bool = True) -> dict[str, Any]:
    """One mapped BLAS / LAPACK library: its provider, version and how it was chosen."""
    mapped = entry["path"]
    real = _realpath(mapped)
    provider, threading = provider_from_path(real)
    out: dict[str, Any] = {"provider": provider, "path": real, "source": "path"}
    if real != mapped:
        out["mapped_as"] = mapped
    if entry.get("deleted"):
        out["deleted"] = True
    if threading:
        out["threading"] = threading
    said = ask_library(mapped) if ask and not entry.get("deleted") else {}
    if said.get("provider"):
        said = dict(said)
        if said.get("parallel"):
            said["threading"] = said.pop("parallel")
        said.pop("parallel", None)
        home = said.get("defined_in")
        # The answer is this library's own when the entry point lives in it or beside it
        # (Debian's openblas-pthread/libblas.so.3 over libopenblasp-r0.3.21.so in the same
        # folder); otherwise it is a dependency's (reference LAPACK over BLIS): a back end.
        own = home is None or home == real or os.path.dirname(home) == os.path.dirname(real)
        if own or (provider == "unknown" and _kind(real) == "blas"):
            out.update(said)
            out["source"] = "symbols"
        else:
            out["backend"] = said
    for alt in alts:
        if alt["value"] == real:
            out["alternative"] = {k: alt[k] for k in ("name", "mode", "link", "chain")}
            break
    package = dpkg_owner(real, dpkg_dir)
    if package:
        out["package"] = package
        if "version" not in out and package.get("version"):
            out["version"] = upstream_version(package["version"])
    return out


def blas_loaded(maps: str = "/proc/self/maps", *, admin_dir: str = "/var/lib/dpkg/alternatives",
                dpkg_dir: str = "/var/lib/dpkg", ask: bool = True) -> dict[str, Any] | None:
    """The BLAS the framework really runs on, found among the libraries mapped into this process.

    The one chosen through Debian's ``libblas.so.3`` alternative comes first, then any other
    BLAS that is not a numpy / scipy wheel's private copy (MXNet's bundled OpenBLAS, a shared
    MKL).  Returns ``{"provider", "path", "version"?, "threading"?, "source", "alternative"?,
    "package"?, "lapack"?, "others"}`` (``others``: the rest of the mapped BLAS libraries,
    numpy's own included), or None when no such BLAS is mapped (PyPI torch links MKL
    statically: its build information says so instead).  Never raises.
    """
    try:
        files = mapped_files(maps)
        alts = alternatives(admin_dir)
        blas = [f for f in files if _kind(f["path"]) == "blas"]
        chosen_values = {a["value"] for a in alts if a["name"].startswith("libblas.so")}

        def rank(entry: dict[str, Any]) -> int:
            real = _realpath(entry["path"])
            if real in chosen_values:
                return 0
            return 2 if bundled_for_numpy(real) else 1

        candidates = sorted(blas, key=rank)
        if not candidates or rank(candidates[0]) == 2:
            return None
        found = describe_library(candidates[0], alts, dpkg_dir=dpkg_dir, ask=ask)
        lapack_values = {a["value"] for a in alts if a["name"].startswith("liblapack.so")}
        lapack = [f for f in files if _kind(f["path"]) == "lapack" or _realpath(f["path"]) in lapack_values]
        if lapack:
            best = sorted(lapack, key=lambda e: 0 if _realpath(e["path"]) in lapack_values else 1)[0]
            found["lapack"] = describe_library(best, alts, dpkg_dir=dpkg_dir, ask=ask)
        # Other BLAS libraries mapped, less the chosen one's own back end (Debian's
        # openblas-pthread/libblas.so.3 is a thin library over libopenblasp-r<version>.so).
        home = os.path.dirname(found["path"])
        found["others"] = [_realpath(f["path"]) for f in candidates[1:]
                           if os.path.dirname(_realpath(f["path"])) != home]
        return found
    except Exception as exc:  # fail soft: the probe must never stop a run
        return {"provider": None, "error": f"{type(exc).__name__}: {exc}"}


def collect(framework: str, params: dict[str, Any], framework_probe: dict[str, Any]) -> dict[str, Any]:
    """The ``probe`` event's fields: the adapter's ``framework_probe`` plus what this module sees.

    ``framework_probe`` holds ``framework_version``, ``build``, ``in_force`` (the framework's
    thread counts, switches and device) and ``mismatches``; the CPU affinity and the cpuset
    check are added here.  An adapter whose thread switch narrows the process's own CPU
    affinity (JAX: XLA sizes its pool from it) gives the affinity the cell started with as
    ``cell_affinity``: the cpuset is checked against that one.  A ``variant = "system"`` cell
    (the site's own Python, which matrun did not build) also records its ``interpreter`` and
    installed ``packages``.
    """
    cpus = affinity()
    mismatches = list(framework_probe.get("mismatches", []))
    asked = params.get("cpuset") or ""
    given = framework_probe.get("cell_affinity") or cpus
    if asked and parse_cpuset(asked) != set(given):
        mismatches.append(f"cpuset: asked {format_cpuset(parse_cpuset(asked))}, in force {format_cpuset(given)}")
    fields = {
        "framework": framework,
        "framework_version": framework_probe.get("framework_version"),
        "python": platform.python_version(),
        "in_force": {**framework_probe.get("in_force", {}), "affinity": cpus},
        "build": framework_probe.get("build", ""),
        "libraries": libraries(),
        "blas_loaded": blas_loaded(),
        "mismatches": mismatches,
    }
    if params.get("variant") == SYSTEM_VARIANT:
        fields.update(installed())
    return fields


def installed() -> dict[str, Any]:
    """The interpreter this process runs in and its installed distributions, ``name==version``
    as ``importlib.metadata`` lists them (sorted as the host's probe of the site's Python sorts
    them, runner/environments/system.py), or null with the reason.  About 60 ms for a few dozen
    distributions."""
    out: dict[str, Any] = {"interpreter": {"executable": sys.executable, "prefix": os.path.realpath(sys.prefix),
                                           "implementation": platform.python_implementation()}}
    try:
        from importlib import metadata

        found = set()
        for dist in metadata.distributions():
            try:
                name, version = dist.metadata["Name"], dist.version
            except Exception:  # a damaged dist-info: left out, as the host's probe leaves it
                continue
            if name and version:
                found.add(f"{name}=={version}")
        out["packages"] = sorted(found, key=lambda d: (d.lower(), d))
    except Exception as exc:  # fail soft: a broken distribution must not stop the run
        out["packages"] = None
        out["packages_error"] = f"{type(exc).__name__}: {exc}"
    return out


# --- the oneDNN check ------------------------------------------------------------------

# Set in the probe run's environment: oneDNN 2+/3.x reads ONEDNN_VERBOSE (or DNNL_VERBOSE),
# MXNet 1.9's MKL-DNN 1.x/2.x reads MKLDNN_VERBOSE / DNNL_VERBOSE.
VERBOSE_VARIABLES = ("ONEDNN_VERBOSE", "DNNL_VERBOSE", "MKLDNN_VERBOSE")
VERBOSE_PREFIXES = ("onednn_verbose,", "dnnl_verbose,", "mkldnn_verbose,")
ONEDNN_PROBE_STEPS = 2
ONEDNN_PROBE_BATCH = 8
ONEDNN_PROBE_TIMEOUT = 300.0
_MATRUN_ROOT = Path(__file__).resolve().parents[3]  # the directory that holds the matrun package


def probe_params(params: dict[str, Any]) -> dict[str, Any]:
    """The cell's parameters cut down to the oneDNN check's short run: the same model, input,
    framework switches and mode, ``ONEDNN_PROBE_STEPS`` steps of a small batch, no layer profile."""
    batch = min(params["batch_size"], ONEDNN_PROBE_BATCH)
    out = {**params, "iterations": ONEDNN_PROBE_STEPS, "warmup_steps": 0, "batch_size": batch,
           "eval_batch_size": min(params["eval_batch_size"], batch), "layer_profile": False,
           "onednn_check": False, "train_limit": ONEDNN_PROBE_STEPS * batch, "test_limit": batch,
           # one process: a worker of a multi-worker cell checks its own framework alone
           "workers": 1, "nodes": 1}
    if params["mode"] != "inference":  # the knobs that need more data or processes than 2 steps
        out.update(validation=0, early_stopping=0, input_pipeline="preloaded", loader_workers=0)
    if params.get("kvstore") is not None:
        out["kvstore"] = "device"
    if params["mode"] != "inference":
        out["epochs"] = None
    if params["dataset"] == "synthetic":  # generated in full before the limits apply
        out["synthetic_train"] = min(params["synthetic_train"], out["train_limit"])
        out["synthetic_test"] = min(params["synthetic_test"], out["test_limit"])
    return out


def count_verbose(stdout: str) -> tuple[int, dict[str, int], list[str]]:
    """(primitives executed, count per primitive kind, first 3 exec lines) of oneDNN verbose output.

    An executed primitive is a line that starts with one of ``VERBOSE_PREFIXES`` and holds
    ``,exec,``: ``onednn_verbose,v1,primitive,exec,cpu,convolution,...`` (oneDNN 3.x),
    ``dnnl_verbose,exec,cpu,reorder,...`` (oneDNN 1.x/2.x), ``mkldnn_verbose,exec,...``.
    The kind is the field after the engine (``graph`` for oneDNN graph partitions).
    """
    count, kinds, sample = 0, {}, []
    for line in stdout.splitlines():
        if not line.startswith(VERBOSE_PREFIXES) or ",exec," not in line:
            continue
        count += 1
        if len(sample) < 3:
            sample.append(line)
        fields = line.split(",")
        at = fields.index("exec")
        kind = "graph" if "graph" in fields[:at] else (fields[at + 2] if len(fields) > at + 2 else "?")
        kinds[kind] = kinds.get(kind, 0) + 1
    return count, kinds, sample


def onednn_check(spec: dict[str, Any], *, timeout: float = ONEDNN_PROBE_TIMEOUT) -> dict[str, Any]:
    """Run this harness again as a subprocess with oneDNN's verbose mode on and count what ran.

    Returns ``primitives`` (None when the check failed), ``kinds``, ``sample``, ``seconds``
    (wall time of the check) and ``error`` (None, or why the check failed).  Never raises:
    a failed check is a note on the run, not a failed run.
    """
    t0 = time.perf_counter()
    result: dict[str, Any] = {"primitives": None, "kinds": {}, "sample": [], "error": None}
    try:
        with tempfile.TemporaryDirectory(prefix="matrun-onednn-") as tmp:
            spec_path = Path(tmp) / "spec.json"
            spec_path.write_text(json.dumps({**spec, "params": probe_params(spec["params"])}), encoding="utf-8")
            env = {**single_process_env(os.environ), **{var: "1" for var in VERBOSE_VARIABLES}}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_MATRUN_ROOT), env.get("PYTHONPATH", "")]))
            proc = subprocess.run([sys.executable, "-m", "matrun.runner.harness", "--spec", str(spec_path),
                                   "--out", tmp, "--onednn-probe"], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, errors="replace", env=env, cwd=tmp,
                                  timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            result["error"] = f"the verbose run exited {proc.returncode}: {tail}"
        else:
            result["primitives"], result["kinds"], result["sample"] = count_verbose(proc.stdout)
    except subprocess.TimeoutExpired:
        result["error"] = f"the verbose run did not finish within {timeout:g} s"
    except Exception as exc:  # fail soft: whatever went wrong, the run itself goes on
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = time.perf_counter() - t0
    return result


def add_onednn_check(fields: dict[str, Any], params: dict[str, Any], check: dict[str, Any] | None) -> list[str]:
    """Put the check's findings into the probe event's ``fields``; return notes for the summary.

    ``onednn_primitives`` / ``onednn_primitive_kinds`` / ``onednn_verbose_sample`` /
    ``onednn_check_seconds`` are null when the cell did not ask for the check; a mismatch is
    added when oneDNN was asked on and nothing ran, or asked off and something ran.
    """
    fields.update(onednn_primitives=None, onednn_primitive_kinds=None, onednn_verbose_sample=None,
                  onednn_check_seconds=None)
    if check is None:
        return []
    fields.update(onednn_primitives=check["primitives"], onednn_primitive_kinds=check["kinds"],
                  onednn_verbose_sample=check["sample"], onednn_check_seconds=check["seconds"])
    if check["error"]:
        fields["onednn_check_error"] = check["error"]
        return [f"oneDNN check failed ({check['error']}); primitives not counted"]
    count = check["primitives"]
    # oneDNN's BLAS-like gemm API (kind "gemm_api") is a library call that frameworks make for
    # plain matrix products whatever their oneDNN switch says (TensorFlow's Eigen kernels do);
    # the switch governs oneDNN's layer primitives, so only those count against "off".
    layer_primitives = count - check["kinds"].get("gemm_api", 0)
    if params["onednn"] and count == 0:
        fields["mismatches"].append("onednn: asked true, but no oneDNN primitive ran (verbose check)")
    elif not params["onednn"] and layer_primitives > 0:
        fields["mismatches"].append(
            f"onednn: asked false, but {layer_primitives} oneDNN layer primitives ran (verbose check)")
    return []
