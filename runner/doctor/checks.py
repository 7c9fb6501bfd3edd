"""The checks of ``matrun doctor``, one concern each: what was found, and for a problem what to do.

A check is ``ok``, ``warn`` (the matrix can run, but something is worth fixing: timings will be
noisy, an environment will be built first) or ``fail`` (the matrix, or some of its cells, cannot
run here as asked).  Every check asks the function the sweep itself relies on, so ``doctor``
and ``sweep`` cannot disagree: the preflight (``runner/planning/preflight.py``), the docker
executor's image lookup (by the recipe-hash label), ``venvs.built_env``, the executors'
``refusal``, ``gpu.gpu_inventory`` (NVML), ``machine.noise_warnings``.  Nothing is changed on
the host: no engine or cluster started, no environment or image built.

The CUDA an image needs is read from the variant's base image (``nvidia/cuda:<major>.<minor>…``,
the Dockerfile's ``ARG BASE_IMAGE`` default or framework.toml's ``base_image``) and compared with
the newest CUDA the driver supports (NVML): an older major version cannot run it; an older minor
version of the same major runs it through CUDA's minor-version compatibility, except kernels
that need the driver to compile PTX (a warning).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from matrun.errors import DataError, InputError, MatrunError
from matrun.runner.environments.contexts import default_base_image
from matrun.runner.environments.engine import EngineUnavailable
from matrun.runner.environments.venvs import built_env
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.gpu import cell_gpu_selectors, resolve_gpus
from matrun.runner.executors.monitor_cgroup import CGROUP_ROOT, cgroup_version
from matrun.runner.executors.protocol import Executor
from matrun.runner.harness.cpusets import format_cpuset, parse_cpuset
from matrun.runner.harness.datasets import GENERATED
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.planning.preflight import preflight_cpus, preflight_data
from matrun.runner.slurm.settings import SlurmSettings
from matrun.runner.slurm.state import SlurmUnavailable, run_slurm
from matrun.runner.sweep.machine import noise_warnings

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)
#: Free space under which the results' or the warehouse's disk is a warning, and a failure.
DISK_WARN_BYTES = 10 << 30
DISK_FAIL_BYTES = 1 << 30
#: What the slurm executor runs on the submit host (``runner/slurm/executor.py``, ``state.py``).
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")
SLURM_TIMEOUT_S = 15.0
#: Where the engine finds CDI specifications when ``docker info`` names none.
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: The hook through which the Docker engine hands GPUs to a container (NVIDIA Container Toolkit).
NVIDIA_HOOK = "nvidia-container-runtime-hook"
SHOWN = 5  # problems listed by name in one check; the rest are counted

_CUDA_TAG = re.compile(r"(?:^|/)cuda:(\d+)\.(\d+)")
_CUDA_VERSION = re.compile(r"^(\d+)\.(\d+)")


@dataclass(frozen=True)
class Check:
    """One check's verdict: ``status`` is ok, warn or fail; ``fix`` says what to do (a command
    where there is one), None when ok or when ``found`` already says it."""

    name: str
    status: str
    found: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_cells(cells: Sequence[PlannedCell]) -> list[PlannedCell]:
    return [pc for pc in cells if pc.cell.values["device"] == "gpu"]


def _listed(problems: Sequence[str]) -> str:
    shown = "; ".join(problems[:SHOWN])
    return shown + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")


def _quoted(path: Path | str) -> str:
    return shlex.quote(str(path))


# --- the cells and this host's CPUs and GPUs ---------------------------------------------------

def cells_check(cells: Sequence[PlannedCell], runner: Executor) -> Check:
    """Cells the executor refuses (``refusal``: e.g. ``nodes`` > 1 on one host) or whose limits
    it cannot enforce (``memory_limit`` without a container), as the sweep refuses them."""
    problems = []
    for pc in cells:
        why = runner.refusal(pc.params)
        if why:
            problems.append(f"cell {pc.cell.label}: {why}")
        if pc.params.get("memory_limit") and "memory_limit" not in runner.enforces:
            problems.append(f"cell {pc.cell.label}: sets memory_limit, which the {runner.name} executor "
                            "cannot enforce")
    if problems:
        return Check("cells", FAIL, f"{len(problems)} problem(s): {_listed(problems)}",
                     "run those cells with an executor that can (--executor docker for memory_limit; "
                     "slurm with runtime = \"local\" for nodes > 1), or leave them out with --where")
    return Check("cells", OK, f"{len(cells)} cell(s), each runnable by the {runner.name} executor")


def cpus_check(cells: Sequence[PlannedCell]) -> Check:
    """The CPUs the cells' cpusets name exist here (``preflight_cpus``)."""
    available = os.sched_getaffinity(0)
    try:
        preflight_cpus(cells)
    except InputError as exc:
        return Check("cpus", FAIL, str(exc),
                     f"set the cells' cpuset to CPUs of this host ({format_cpuset(available)})")
    pinned = [pc for pc in cells if pc.cell.values["cpuset"]]
    if not pinned:
        return Check("cpus", OK, f"no cell sets a cpuset; {len(available)} CPU(s) here ({format_cpuset(available)})")
    return Check("cpus", OK, f"{len(pinned)} cell(s) pinned to CPUs this host offers ({format_cpuset(available)})")


def cell_cpus(cells: Sequence[PlannedCell]) -> set[int] | None:
    """The CPUs of this host the cells run on: their cpusets together; None when one of them is
    not pinned (or names none of this host's CPUs: the ``cpus`` check says so)."""
    cpus: set[int] = set()
    for pc in cells:
        if not pc.cell.values["cpuset"]:
            return None
        cpus |= parse_cpuset(pc.cell.values["cpuset"])
    return (cpus & os.sched_getaffinity(0)) or None


def describe_inventory(inventory: Mapping[str, Any]) -> str:
    """NVML's inventory in a phrase: the GPUs and the driver, or why NVML cannot tell."""
    if not inventory.get("available"):
        return f"no GPU seen (NVML: {inventory.get('reason') or 'unavailable'})"
    gpus = inventory.get("gpus") or []
    models = ", ".join(f"{n} × {name}" for name, n in Counter(g.get("name") or "?" for g in gpus).items())
    return (f"{len(gpus)} GPU(s){': ' + models if models else ''}; driver {inventory.get('driver_version') or '?'} "
            f"(CUDA up to {inventory.get('cuda_driver_version') or '?'})")


def gpus_check(cells: Sequence[PlannedCell], inventory: Mapping[str, Any]) -> Check:
    """GPU cells get the GPUs they ask for (``gpus``, or exactly ``gpu_ids``) among those NVML
    sees; no GPU here is a failure only when a cell asks for one."""
    wanted = gpu_cells(cells)
    seen = describe_inventory(inventory)
    if not wanted:
        return Check("gpus", OK, f"no cell asks for a GPU; {seen}")
    if not inventory.get("available"):
        return Check("gpus", FAIL, f"{len(wanted)} cell(s) ask for a GPU; {seen}",
                     "run the matrix on a host with NVIDIA GPUs, their driver and nvidia-ml-py "
                     "(pip install 'matrun[gpu]'), or leave the GPU cells out (--where device=cpu)")
    problems = []
    for pc in wanted:
        _, unknown = resolve_gpus(cell_gpu_selectors(pc.params), inventory.get("gpus") or [])
        if unknown:
            problems.append(f"cell {pc.cell.label} asks for GPU(s) {', '.join(unknown)}")
    if problems:
        return Check("gpus", FAIL, f"{seen}; {_listed(problems)}",
                     "ask for GPUs this host has (gpus, gpu_ids), or run those cells on a larger GPU host")
    return Check("gpus", OK, f"{len(wanted)} GPU cell(s); {seen}")


def cuda_needed(base_image: str) -> tuple[int, int] | None:
    """The CUDA version an image built on ``base_image`` needs (``nvidia/cuda:13.0.2-…`` → (13, 0)),
    or None when the base image names none."""
    match = _CUDA_TAG.search(base_image)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_checks(variants: Iterable[tuple[str, str]], inventory: Mapping[str, Any]) -> list[Check]:
    """For each (framework, variant) of the GPU cells, the driver supports the CUDA its image needs."""
    checks = []
    supported = _CUDA_VERSION.match(str(inventory.get("cuda_driver_version") or ""))
    driver = (int(supported.group(1)), int(supported.group(2))) if supported else None
    for framework, variant in variants:
        name = f"cuda {framework}:{variant}"
        try:
            base = default_base_image(framework, variant)
        except InputError as exc:
            checks.append(Check(name, FAIL, str(exc)))
            continue
        needed = cuda_needed(base)
        if needed is None:
            checks.append(Check(name, WARN, f"its base image {base} names no CUDA version: not compared with the "
                                            "driver", "check by hand that the driver supports the image's CUDA"))
            continue
        need = f"{needed[0]}.{needed[1]}"
        if not inventory.get("available") or driver is None:
            checks.append(Check(name, FAIL, f"needs CUDA {need} (base image {base}); {describe_inventory(inventory)}",
                                f"run it on a host whose NVIDIA driver supports CUDA {need} or newer"))
        elif driver[0] < needed[0]:
            checks.append(Check(name, FAIL, f"needs CUDA {need} (base image {base}); the driver "
                                            f"{inventory.get('driver_version') or '?'} supports CUDA up to "
                                            f"{driver[0]}.{driver[1]}",
                                f"update the NVIDIA driver to one for CUDA {need} or newer, or use a variant "
                                "built on an older CUDA"))
        elif driver < needed:
            checks.append(Check(name, WARN, f"needs CUDA {need} (base image {base}); the driver supports CUDA up "
                                            f"to {driver[0]}.{driver[1]}: it runs through CUDA's minor-version "
                                            "compatibility, but kernels the driver must compile from PTX fail",
                                f"update the NVIDIA driver to one for CUDA {need} or newer"))
        else:
            checks.append(Check(name, OK, f"needs CUDA {need} (base image {base}); the driver supports CUDA up to "
                                          f"{driver[0]}.{driver[1]}"))
    return checks


# --- the Docker engine -------------------------------------------------------------------------

def engine_check(runner: DockerExecutor) -> tuple[Check, dict[str, Any] | None]:
    """The local Docker engine answers (and what ``docker info`` says, for the checks after it)."""
    try:
        client = runner.client
        version = client.version()
        info = client.info()
    except MatrunError as exc:  # EngineUnavailable; InputError for a DOCKER_HOST matrun refuses
        return Check("engine", FAIL, str(exc),
                     "start one (`matrun engine start`, as root), point DOCKER_HOST at a local one, or run "
                     "with --executor local; then `matrun doctor` again checks the images"), None
    except Exception as exc:  # the SDK's own errors: the engine went away between ping and info
        return Check("engine", FAIL, f"the Docker engine at {runner.url} did not answer: {exc}",
                     "`matrun engine status`; start it with `matrun engine start`"), None
    return Check("engine", OK, f"Docker {version.get('Version', '?')} answers at {runner.url} (cgroup "
                               f"v{info.get('CgroupVersion', '?')}, driver {info.get('CgroupDriver', '?')})"), info


def gpu_runtime_check(info: Mapping[str, Any], *, which: Callable[[str], str | None] = shutil.which) -> Check:
    """How the engine hands GPUs to a container: an NVIDIA runtime, the NVIDIA Container Toolkit's
    hook (what a ``--gpus`` device request uses), or CDI specifications of NVIDIA devices."""
    found = [f"runtime {name}" for name in (info.get("Runtimes") or {}) if "nvidia" in name]
    hook = which(NVIDIA_HOOK)
    if hook:
        found.append(f"{NVIDIA_HOOK} at {hook}")
    for directory in info.get("CDISpecDirs") or CDI_DIRS:
        for spec in sorted(Path(directory).glob("*")) if Path(directory).is_dir() else []:
            try:
                if spec.is_file() and "nvidia.com/gpu" in spec.read_text(encoding="utf-8", errors="replace"):
                    found.append(f"CDI spec {spec}")
            except OSError:
                continue
    if found:
        return Check("gpu-runtime", OK, "the engine can give containers GPUs: " + ", ".join(found))
    runtimes = ", ".join(info.get("Runtimes") or {}) or "none"
    return Check("gpu-runtime", FAIL, f"GPU cells under docker need the NVIDIA container runtime; the engine has "
                                      f"runtimes {runtimes}, no {NVIDIA_HOOK} on PATH, no NVIDIA CDI specification",
                 "install the NVIDIA Container Toolkit (nvidia-container-toolkit), run `nvidia-ctk runtime "
                 "configure --runtime=docker` and restart the engine (`matrun engine stop`, `matrun engine start`)")


def cgroup_check(info: Mapping[str, Any] | None = None, root: Path = CGROUP_ROOT) -> Check:
    """The controllers the docker monitor reads a container's CPU time and memory from
    (``runner/executors/monitor_cgroup.py``): cpuacct and memory (v1), cpu and memory (v2)."""
    version = cgroup_version(root)
    if version == 2:
        try:
            controllers = set((root / "cgroup.controllers").read_text().split())
        except OSError:
            controllers = set()
        missing = [c for c in ("cpu", "memory") if c not in controllers]
    else:
        missing = [c for c in ("cpuacct", "memory") if not (root / c).is_dir()]
    engine = f"; the engine reports v{info['CgroupVersion']}" if info and info.get("CgroupVersion") else ""
    if missing:
        return Check("cgroup", WARN, f"cgroup v{version} at {root} without the {', '.join(missing)} controller(s)"
                                     f"{engine}: the docker monitor records no CPU time or memory of containers",
                     f"enable the {', '.join(missing)} controller(s) (the kernel's cgroup_enable= boot option, or "
                     "the system's cgroup mounts)")
    wanted = "cpu, memory" if version == 2 else "cpuacct, memory"
    return Check("cgroup", OK, f"cgroup v{version} ({wanted}){engine}: the docker monitor reads containers' CPU "
                               "time and memory")


def image_checks(runner: DockerExecutor, variants: Iterable[tuple[str, str]],
                 build: Callable[[str, str], str]) -> list[Check]:
    """Each (framework, variant) has an image built from its current recipe (the docker executor's
    own lookup, by the recipe-hash label); ``build`` gives the command that builds one."""
    checks = []
    for framework, variant in variants:
        name = f"image {framework}:{variant}"
        try:
            ref = runner.image(framework, variant)
        except EngineUnavailable as exc:
            checks.append(Check(name, FAIL, str(exc), "`matrun engine status`; start it with `matrun engine start`"))
        except MatrunError as exc:
            checks.append(Check(name, FAIL, str(exc), build(framework, variant)))
        else:
            checks.append(Check(name, OK, f"{ref.tag} ({ref.image_id[:19]})"))
    return checks


# --- local environments ------------------------------------------------------------------------

def environment_checks(variants: Iterable[tuple[str, str]], build: Callable[[str, str], str],
                       image: Callable[[str, str], str]) -> list[Check]:
    """Each (framework, variant) has its virtual environment built; one missing is built by the
    sweep before its first cell (a warning), an image-only variant has none (a failure)."""
    checks = []
    for framework, variant in variants:
        name = f"environment {framework}:{variant}"
        try:
            env, built = built_env(framework, variant)
        except InputError as exc:
            checks.append(Check(name, FAIL, str(exc),
                                f"run these cells with --executor docker ({image(framework, variant)})"))
            continue
        if built:
            checks.append(Check(name, OK, f"{env.spec.env_id} built at {env.path}"))
        else:
            checks.append(Check(name, WARN, f"{env.spec.env_id} is not built yet: the sweep builds it before its first "
                                            f"cell, at {env.path} (pip needs the package index or a wheelhouse)",
                                build(framework, variant)))
    return checks


# --- Slurm -------------------------------------------------------------------------------------

def slurm_checks(settings: SlurmSettings, *, which: Callable[[str], str | None] = shutil.which) -> list[Check]:
    """The Slurm client on PATH, a controller that answers (``scontrol ping``), the partitions
    ``[slurm] partition`` names, and the interpreter ``[slurm] python`` names."""
    missing = [c for c in SLURM_COMMANDS if which(c) is None]
    if missing:
        return [Check("slurm-client", FAIL, f"{', '.join(missing)} not on PATH",
                      "install Slurm's client (Debian: apt-get install slurm-client) and run matrun on a host "
                      "that can submit to the cluster")]
    checks = [Check("slurm-client", OK, ", ".join(f"{c} at {which(c)}" for c in SLURM_COMMANDS))]
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # scontrol would retry reading it for a minute
        answer, up = f"SLURM_CONF names {conf}, which is not a file", False
    else:
        answer, up = _ping()
    if not up:
        checks.append(Check("slurm-controller", FAIL, f"no Slurm controller answers ({answer}; SLURM_CONF: "
                                                      f"{conf or 'unset'})",
                            "point SLURM_CONF at the cluster's slurm.conf, or start the local test cluster "
                            "(`matrun slurm start`, then the `export SLURM_CONF=…` it prints)"))
        return checks + _slurm_python(settings)
    checks.append(Check("slurm-controller", OK, f"{answer} (SLURM_CONF: {conf or 'unset'})"))
    checks.append(_partition_check(settings))
    return checks + _slurm_python(settings)


def _ping() -> tuple[str, bool]:
    """What ``scontrol ping`` says (its ``Slurmctld(primary) at HOST is UP`` line, else its last
    complaint) and whether the controller is up."""
    try:
        ping = run_slurm(["scontrol", "ping"], timeout=SLURM_TIMEOUT_S, check=False)
    except SlurmUnavailable as exc:
        return str(exc), False
    status = [line.strip() for line in ping.stdout.splitlines() if line.strip().startswith("Slurmctld")]
    complaint = ping.stderr.strip().splitlines()
    answer = status[0] if status else (complaint[-1] if complaint else f"scontrol ping exited {ping.returncode}")
    return f"scontrol ping: {answer}", ping.returncode == 0 and bool(status) and answer.endswith(" UP")


def _partition_check(settings: SlurmSettings) -> Check:
    proc = run_slurm(["sinfo", "-h", "-o", "%P"], timeout=SLURM_TIMEOUT_S, check=False) \
        if shutil.which("sinfo") else None
    if proc is None or proc.returncode != 0:
        return Check("slurm-partition", WARN, "sinfo did not list the partitions; not checked",
                     "`sinfo` shows what the cluster offers")
    listed = [p.strip() for p in proc.stdout.split() if p.strip()]
    names = {p.rstrip("*") for p in listed}
    if not settings.partition:
        default = [p.rstrip("*") for p in listed if p.endswith("*")]
        if not default:
            return Check("slurm-partition", FAIL, f"no [slurm] partition and the cluster has no default partition "
                                                  f"(partitions: {', '.join(sorted(names)) or 'none'})",
                         "set [slurm] partition (or --partition) to one of the cluster's partitions")
        return Check("slurm-partition", OK, f"the cluster's default partition {default[0]} (partitions: "
                                            f"{', '.join(sorted(names))})")
    unknown = [p for p in settings.partition.split(",") if p not in names]
    if unknown:
        return Check("slurm-partition", FAIL, f"[slurm] partition names {', '.join(unknown)}, which the cluster does "
                                              f"not have (partitions: {', '.join(sorted(names)) or 'none'})",
                     "set [slurm] partition (or --partition) to one of the cluster's partitions")
    return Check("slurm-partition", OK, f"partition {settings.partition} exists")


def _slurm_python(settings: SlurmSettings) -> list[Check]:
    if settings.python is None:
        return []
    path = Path(settings.python)
    if path.is_file() and os.access(path, os.X_OK):
        return [Check("slurm-python", OK, f"{path} (the nodes must see it at the same path)")]
    return [Check("slurm-python", FAIL, f"[slurm] python {path} is not an executable file here (the submit host "
                                        "and the nodes see it at the same path)",
                  "point [slurm] python at an interpreter with matrun installed on the shared file system")]


# --- data, disks and the machine --------------------------------------------------------------

def dataset_checks(cells: Sequence[PlannedCell], data_dir: Path) -> list[Check]:
    """Each dataset the cells read is staged in ``data_dir`` (``preflight_data``, per dataset)."""
    names = sorted({pc.cell.values["dataset"] for pc in cells} - GENERATED)
    if not names:
        return [Check("data", OK, "the cells read synthetic data only: no files needed")]
    checks = []
    for name in names:
        try:
            preflight_data([pc for pc in cells if pc.cell.values["dataset"] == name], data_dir)
        except DataError as exc:
            checks.append(Check(f"dataset {name}", FAIL, str(exc),
                                f"matrun data import {name} PATH --data-dir {_quoted(data_dir)}"))
        else:
            checks.append(Check(f"dataset {name}", OK, f"staged in {data_dir / name}"))
    return checks


def disk_check(label: str, path: Path, *, warn_bytes: int = DISK_WARN_BYTES,
               fail_bytes: int = DISK_FAIL_BYTES) -> Check:
    """Free space on the file system ``path`` is (or will be) on: its nearest existing folder."""
    anchor = path.absolute()
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    name = f"disk {label}"
    try:
        free = shutil.disk_usage(anchor).free
    except OSError as exc:
        return Check(name, FAIL, f"cannot read the free space of {anchor}: {exc.strerror or exc}",
                     f"check that {anchor} is readable (`df -h {_quoted(anchor)}`)")
    found = f"{free / (1 << 30):.1f} GiB free for {path} (file system of {anchor})"
    fix = (f"free space there (`df -h {_quoted(anchor)}`), or point [sweep] {label} at a larger disk")
    if free < fail_bytes:
        return Check(name, FAIL, f"{found}: under {fail_bytes / (1 << 30):g} GiB", fix)
    if free < warn_bytes:
        return Check(name, WARN, f"{found}: under {warn_bytes / (1 << 30):g} GiB", fix)
    return Check(name, OK, found)


def machine_checks(cpus: set[int] | None) -> list[Check]:
    """``noise_warnings``: a busy machine, a powersave governor (each sentence says how to fix it)."""
    warnings = noise_warnings(cpus)
    if not warnings:
        where = f"CPUs {format_cpuset(cpus)}" if cpus else "this host's CPUs"
        return [Check("machine", OK, f"no noise found on {where} (other processes' load, frequency governor)")]
    return [Check("machine", WARN, text) for text in warnings]
