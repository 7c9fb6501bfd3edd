"""What is really in force in this process, as far as the standard library can tell.

The framework's own view (its version, build, thread counts, switches) comes from the
adapter's ``probe``; ``collect`` merges the two into the ``probe`` event.  Everything here
fails soft: what cannot be read is left out, never an error.
"""

from __future__ import annotations

import os
import platform
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
