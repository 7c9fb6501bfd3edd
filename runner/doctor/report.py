"""``doctor``: which checks a matrix needs on this host, run in order, as one report.

The matrix is loaded, profiled and sliced (``--where``) exactly as ``matrun sweep`` does, and
the executor picked the same way (``--executor``, else the matrix's ``[sweep] executor``;
``auto``: docker when a local engine answers, else local).  Only what that executor and those
cells need can fail: no engine is fine for the local executor, no GPU unless a cell asks for
one, Slurm only for the slurm executor (whose nodes, not this host, have the GPUs, images and
cgroups; the datasets and, for its local runtime, the environments are seen at the same paths).
A malformed matrix or flag raises the loader's ``InputError`` (exit 2), as for every command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from matrun.errors import InputError
from matrun.runner.doctor.checks import (
    FAIL, OK, WARN, Check, cell_cpus, cells_check, cgroup_check, cpus_check, cuda_checks, dataset_checks, disk_check,
    engine_check, environment_checks, gpu_cells, gpu_runtime_check, gpus_check, image_checks, machine_checks,
    slurm_checks,
)
from matrun.runner.environments.contexts import images_needed
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.gpu import gpu_inventory
from matrun.runner.executors.protocol import Executor
from matrun.runner.executors.registry import get_executor
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.planning.identity import PlannedCell, plan_cells
from matrun.runner.planning.matrix import Matrix, load_matrix
from matrun.runner.planning.preflight import resolve_data_dir
from matrun.runner.planning.selection import parse_where, select
from matrun.runner.slurm.executor import SlurmExecutor


@dataclass(frozen=True)
class DoctorReport:
    """The checks of one matrix on this host; ``ok`` when none failed (warnings allowed)."""

    matrix: Path
    executor: str  # the executor the checks are for (auto resolved)
    cells: int
    checks: tuple[Check, ...]

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of ``matrun doctor --json``."""
        return {"ok": self.ok, "matrix": str(self.matrix), "executor": self.executor, "cells": self.cells,
                "failures": len(self.failures), "warnings": len(self.warnings),
                "checks": [c.as_dict() for c in self.checks]}


def doctor(*, matrix_path: Path, executor: str | None = None, where: Sequence[str] = (),
           profile: str | None = None) -> DoctorReport:
    """Check this host against what the selected cells of the matrix need under ``executor``
    (default: the matrix's ``[sweep] executor``)."""
    matrix = load_matrix(matrix_path, profile)
    filters = parse_where(where)
    name = matrix.sweep.executor if executor is None else executor  # an empty --executor is refused
    runner, picked = get_executor(name, slurm=matrix.slurm if name == "slurm" else None)
    cells = select(plan_cells(matrix, _env_ids(runner)), filters)
    if not cells:
        raise InputError(f"{matrix_path}: no cells to check")
    commands = _Commands(matrix_path, profile)
    checks: list[Check] = [Check("executor", OK, picked), cells_check(cells, runner)]
    if isinstance(runner, SlurmExecutor):
        checks += slurm_checks(runner.settings)
        if runner.settings.runtime == "local":  # the nodes run matrun's environments, at the same path
            checks += environment_checks(_built(cells), commands.envs, commands.image)
    else:
        checks += _host_checks(cells, runner, commands)
    checks += dataset_checks(cells, resolve_data_dir(matrix))
    checks += _disk_checks(matrix)
    checks += machine_checks(cell_cpus(cells))
    return DoctorReport(matrix_path, runner.name, len(cells), tuple(checks))


def _host_checks(cells: Sequence[PlannedCell], runner: Executor, commands: "_Commands") -> list[Check]:
    """This host runs the cells itself (local, docker): its CPUs, GPUs, CUDA driver, and the
    engine, runtime, cgroups and images (docker) or the environments (local)."""
    checks = [cpus_check(cells)]
    inventory = gpu_inventory()
    checks.append(gpus_check(cells, inventory))
    gpu_variants = _built(gpu_cells(cells))
    checks += cuda_checks(gpu_variants, inventory)
    if not isinstance(runner, DockerExecutor):
        return checks + environment_checks(_built(cells), commands.envs, commands.image)
    engine, info = engine_check(runner)
    checks.append(engine)
    if info is None:  # nothing more to ask an engine that does not answer
        return checks
    if gpu_variants:
        checks.append(gpu_runtime_check(info))
    checks.append(cgroup_check(info))
    return checks + image_checks(runner, _built(cells), commands.image)


def _built(cells: Sequence[PlannedCell]) -> list[tuple[str, str]]:
    """The (framework, variant) pairs of the cells that matrun builds (an environment, an image):
    not ``variant = "system"``, the site's own Python, which the executor's ``refusal`` (the
    ``cells`` check) looks at."""
    return [pair for pair in images_needed(cells) if pair[1] != SYSTEM_VARIANT]


def _disk_checks(matrix: Matrix) -> list[Check]:
    checks = [disk_check("results", matrix.sweep.results)]
    if matrix.sweep.warehouse.absolute() != matrix.sweep.results.absolute():
        checks.append(disk_check("warehouse", matrix.sweep.warehouse))
    return checks


def _env_ids(runner: Executor) -> Callable[[str, str], str]:
    """The executor's environment ids, for cell ids as the sweep computes them; a variant the
    executor has no environment for (image-only under local) gets a stand-in, and its check says why."""
    def env_id(framework: str, variant: str) -> str:
        try:
            return runner.env_id(framework, variant)
        except InputError:
            return f"{framework}-{variant}-none"

    return env_id


@dataclass(frozen=True)
class _Commands:
    """The commands a fix names, for this matrix file and profile."""

    matrix: Path
    profile: str | None

    def _matrix_args(self) -> str:
        profile = f" --profile {shlex.quote(self.profile)}" if self.profile else ""
        return f"{shlex.quote(str(self.matrix))}{profile}"

    def envs(self, framework: str, variant: str) -> str:
        return f"matrun envs {self._matrix_args()} --build"

    def image(self, framework: str, variant: str) -> str:
        return (f"matrun build {self._matrix_args()} --where {shlex.quote(f'framework={framework}')} "
                f"--where {shlex.quote(f'variant={variant}')}")
