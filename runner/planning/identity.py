"""Cells with identities, slices of them (``--where``), and what earlier runs already did.

A cell's id hashes its canonical identity parameters together with the identity of its
environment, so changing a parameter or the environment (pins, Python, harness protocol)
gives a new id and the sweep re-runs exactly that.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from matrun.errors import DataError, InputError, MatrunError
from matrun.runner.datasets.staging import default_data_dir
from matrun.runner.harness import DataError as CellDataError
from matrun.runner.harness import datasets as cell_data
from matrun.runner.planning.matrix import CellParams, Matrix, _plain
from matrun.runner.planning.params import PARAMS, cpuset_cpus



@dataclass(frozen=True)
class PlannedCell:
    cell: CellParams
    cell_id: str
    env_id: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.cell.values)


def cell_id(identity: dict[str, Any], env_id: str) -> str:
    canonical = json.dumps({"env": env_id, "params": identity}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_cells(matrix: Matrix, env_id_of) -> list[PlannedCell]:
    """Attach identities; ``env_id_of(framework, variant)`` comes from the executor."""
    planned = []
    for cell in matrix.cells:
        env = env_id_of(cell.values["framework"], cell.values["variant"])
        planned.append(PlannedCell(cell, cell_id(cell.identity, env), env))
    return planned


def parse_where(expressions: Sequence[str]) -> dict[str, set[str]]:
    """``["threads=1,2", "batch_size=64"]`` → ``{"threads": {"1", "2"}, "batch_size": {"64"}}``."""
    where: dict[str, set[str]] = {}
    for expr in expressions:
        key, sep, values = expr.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise InputError(f"--where {expr!r}: expected KEY=VALUE[,VALUE…], e.g. threads=1,2")
        if key != "cell" and key not in PARAMS:
            raise InputError(f"--where {expr!r}: unknown parameter {key!r}; known: cell, {', '.join(PARAMS)}")
        where.setdefault(key, set()).update(v.strip() for v in values.split(","))
    return where


def select(cells: Iterable[PlannedCell], where: dict[str, set[str]]) -> list[PlannedCell]:
    def keep(pc: PlannedCell) -> bool:
        for key, wanted in where.items():
            if key == "cell":
                if not any(pc.cell_id.startswith(w) for w in wanted):
                    return False
            elif _as_text(pc.cell.values[key]) not in wanted:
                return False
        return True

    chosen = [pc for pc in cells if keep(pc)]
    if where and not chosen:
        raise InputError("--where matches no cell of the matrix")
    return chosen


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return _plain(value)


def resolve_data_dir(matrix: Matrix) -> Path:
    return matrix.sweep.data_dir or default_data_dir()


def preflight(cells: Sequence[PlannedCell], data_dir: Path) -> None:
    """Host checks that would otherwise fail every cell: data present, CPUs that exist."""
    available = os.sched_getaffinity(0)
    for pc in cells:
        v = pc.cell.values
        missing = cpuset_cpus(v["cpuset"]) - available
        if missing:
            raise InputError(f"cell {pc.cell.label}: cpuset {v['cpuset']!r} names CPUs this host "
                             f"does not offer ({', '.join(map(str, sorted(missing)))}); "
                             f"available: {', '.join(map(str, sorted(available)))}")
    gpus_here = host_gpus()
    for pc in cells:
        asked = pc.cell.values["gpus"] or 0
        if pc.cell.values["device"] == "gpu" and asked > gpus_here:
            raise MatrunError(f"cell {pc.cell.label}: asks for {asked} GPU(s); this host has {gpus_here} "
                              "(counted as /dev/nvidia<N> devices); run it on a GPU host or use device = \"cpu\"")
    preflight_data(cells, data_dir)


def preflight_data(cells: Sequence[PlannedCell], data_dir: Path) -> None:
    """The datasets the cells read are present in ``data_dir`` (for a cluster: the nodes see
    the same path on a shared file system)."""
    for dataset in sorted({pc.cell.values["dataset"] for pc in cells} - {"synthetic"}):
        try:
            cell_data.require(data_dir, dataset)
        except CellDataError as exc:
            raise DataError(f"dataset {dataset!r}: {exc}; or point [sweep] data_dir / MATRUN_DATA "
                            f"at the directory holding {dataset}/") from None


def host_gpus() -> int:
    """NVIDIA GPUs this host exposes (character devices /dev/nvidia0, /dev/nvidia1, …)."""
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*") if p.name[len("nvidia"):].isdigit())


def done_runs(warehouse: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(cell_id, repeat) → its status row, from the warehouse (empty when there is none yet)."""
    if not warehouse.exists():
        return {}
    from matrun.warehouse.db import open_warehouse

    with open_warehouse(warehouse, read_only=True, wait_s=30) as wh:
        rows = wh.con.execute(
            "SELECT cell_id, repeat, attempts, last_status, ok, max_attempt FROM cell_status").fetchall()
    return {(r[0], r[1]): {"attempts": r[2], "last_status": r[3], "ok": bool(r[4]), "max_attempt": r[5]}
            for r in rows}


def durations(warehouse: Path) -> dict[str, float]:
    """cell_id → median wall seconds of its ok runs (for estimates)."""
    if not warehouse.exists():
        return {}
    from matrun.warehouse.db import open_warehouse

    with open_warehouse(warehouse, read_only=True, wait_s=30) as wh:
        rows = wh.con.execute("SELECT cell_id, wall_seconds_median FROM cell_durations").fetchall()
    return {r[0]: float(r[1]) for r in rows if r[1] is not None}
