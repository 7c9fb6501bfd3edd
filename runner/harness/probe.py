"""What is really in force in this process, as far as the standard library can tell.

The framework's own view (its version, build, thread counts, switches) comes from the
adapter's ``probe``; ``collect`` merges the two into the ``probe`` event.  Everything here
fails soft: what cannot be read is left out, never an error.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Basename prefixes of the math and threading libraries worth reporting.
LIBRARY_PREFIXES = ("libmkl", "libiomp", "libgomp", "libomp", "libopenblas", "libblis",
                    "libblas", "libdnnl", "libmkldnn")


def parse_cpuset(text: str) -> set[int]:
    """CPU ids of a cpuset string such as ``"0-1,3"`` (``""``: the empty set); ValueError if malformed."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f'expected a CPU list such as "0-1,3" or "", got "{text}"')
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f'CPU range "{part}" runs backwards')
        cpus.update(range(first, last + 1))
    return cpus


def format_cpuset(cpus: set[int] | list[int]) -> str:
    """The shortest cpuset string for ``cpus`` (``[0, 1, 3]`` -> ``"0-1,3"``)."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def affinity() -> list[int]:
    """CPU ids this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


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


def collect(framework: str, params: dict[str, Any], framework_probe: dict[str, Any]) -> dict[str, Any]:
    """The ``probe`` event's fields: the adapter's ``framework_probe`` plus what this module sees.

    ``framework_probe`` holds ``framework_version``, ``build``, ``in_force`` (the framework's
    thread counts, switches and device) and ``mismatches``; the CPU affinity and the cpuset
    check are added here.
    """
    cpus = affinity()
    mismatches = list(framework_probe.get("mismatches", []))
    asked = params.get("cpuset") or ""
    if asked and parse_cpuset(asked) != set(cpus):
        mismatches.append(f"cpuset: asked {format_cpuset(parse_cpuset(asked))}, in force {format_cpuset(cpus)}")
    return {
        "framework": framework,
        "framework_version": framework_probe.get("framework_version"),
        "python": platform.python_version(),
        "in_force": {**framework_probe.get("in_force", {}), "affinity": cpus},
        "build": framework_probe.get("build", ""),
        "libraries": libraries(),
        "mismatches": mismatches,
    }


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
           "onednn_check": False, "train_limit": ONEDNN_PROBE_STEPS * batch, "test_limit": batch}
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
            env = {**os.environ, **{var: "1" for var in VERBOSE_VARIABLES}}
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
