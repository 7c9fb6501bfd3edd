"""Host checks before a sweep starts: what would otherwise fail every cell one by one
(the data directory and its datasets, CPUs and GPUs this host does not have)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from matrun.errors import DataError, InputError, MatrunError
from matrun.runner.datasets.staging import default_data_dir
from matrun.runner.harness import datasets as cell_data
from matrun.runner.harness.cpusets import parse_cpuset
from matrun.runner.harness.errors import DataError as CellDataError
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.planning.matrix import Matrix


def resolve_data_dir(matrix: Matrix) -> Path:
    """``[sweep] data_dir``, else ``$MATRUN_DATA``, else /usr/share/datasets."""
    return matrix.sweep.data_dir or default_data_dir()


def preflight(cells: Sequence[PlannedCell], data_dir: Path) -> None:
    """Host checks that would otherwise fail every cell: data present, CPUs that exist."""
    preflight_cpus(cells)
    gpus_here = host_gpus()
    for pc in cells:
        asked = pc.cell.values["gpus"] or 0
        if pc.cell.values["device"] == "gpu" and asked > gpus_here:
            raise MatrunError(f"cell {pc.cell.label}: asks for {asked} GPU(s); this host has {gpus_here} "
                              "(counted as /dev/nvidia<N> devices); run it on a GPU host or use device = \"cpu\"")
    preflight_data(cells, data_dir)


def preflight_cpus(cells: Sequence[PlannedCell]) -> None:
    """Every CPU the cells' cpusets name is one this process may run on (``InputError``, naming
    the first cell that asks for others)."""
    available = os.sched_getaffinity(0)
    for pc in cells:
        v = pc.cell.values
        missing = parse_cpuset(v["cpuset"]) - available
        if missing:
            raise InputError(f"cell {pc.cell.label}: cpuset {v['cpuset']!r} names CPUs this host "
                             f"does not offer ({', '.join(map(str, sorted(missing)))}); "
                             f"available: {', '.join(map(str, sorted(available)))}")


def preflight_study(matrix: Matrix, cells: Sequence[PlannedCell]) -> None:
    """A study whose cells (in the profile run) need GPUs, run on a host without enough of them,
    is refused before anything runs, with what it needs; its CPU profiles run anywhere."""
    study = matrix.study
    asked = max((pc.cell.values["gpus"] or 0 for pc in cells if pc.cell.values["device"] == "gpu"), default=0)
    if study is None or not asked:
        return
    needed = asked
    here = host_gpus()
    if here < needed:
        profile = f" (profile {matrix.profile})" if matrix.profile else ""
        raise MatrunError(f"study {study.id}{profile}, {study.title}: needs a GPU host with {needed} NVIDIA GPU(s) "
                          f"(its cells run with device = \"gpu\"; {study.source} of the paper); this host has "
                          f"{here}. Run it on a GPU host, or with --executor slurm on a GPU partition")


def preflight_data(cells: Sequence[PlannedCell], data_dir: Path) -> None:
    """The datasets the cells read are present in ``data_dir`` (for a cluster: the nodes see
    the same path on a shared file system)."""
    for dataset in sorted({pc.cell.values["dataset"] for pc in cells} - cell_data.GENERATED):
        try:
            cell_data.require(data_dir, dataset)
        except CellDataError as exc:
            raise DataError(f"dataset {dataset!r}: {exc}; or point [sweep] data_dir / MATRUN_DATA "
                            f"at the directory holding {dataset}/") from None


def host_gpus() -> int:
    """NVIDIA GPUs this host exposes (character devices /dev/nvidia0, /dev/nvidia1, …)."""
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*") if p.name[len("nvidia"):].isdigit())
