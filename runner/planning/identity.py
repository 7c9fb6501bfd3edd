"""Cells with identities: a cell's id hashes its canonical identity parameters together with
the identity of its environment.

Changing a parameter or the environment (pins, Python, harness protocol; for the site's own
Python, what its probe finds) therefore gives a new id, and the sweep re-runs exactly that.  The ids of every cell of matrix.toml and of the
studies are pinned by tests/golden/cell_ids.json.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

from matrun.runner.environments.releases import env_variant
from matrun.runner.environments.system import system_env_id
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.planning.matrix import CellParams, Matrix


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


def plan_cells(matrix: Matrix, env_id_of: Callable[[str, str], str]) -> list[PlannedCell]:
    """Attach identities; ``env_id_of(framework, variant)`` comes from the executor (a cell
    with ``version`` asks for ``variant@version``: releases.py ``env_variant``).

    A ``variant = "system"`` cell's environment is the site's own Python, whichever executor
    is asked: its id comes from a probe of the interpreter (``environments/system.py``), so
    two ``python`` paths to the same install are one environment, and the cell is planned once.
    """
    planned = []
    system_cells: set[str] = set()
    for cell in matrix.cells:
        cid, env = identify(cell, env_id_of)
        if cell.values["variant"] != SYSTEM_VARIANT:
            planned.append(PlannedCell(cell, cid, env))
            continue
        if cid not in system_cells:  # another path to an install already planned: the same cell
            system_cells.add(cid)
            planned.append(PlannedCell(cell, cid, env))
    return planned


def identify(cell: CellParams, env_id_of: Callable[[str, str], str]) -> tuple[str, str]:
    """(cell id, environment id) of one cell, as ``plan_cells`` gives them."""
    values = cell.values
    if values["variant"] != SYSTEM_VARIANT:
        env = env_id_of(values["framework"], env_variant(values))
    else:
        env = system_env_id(values["framework"], values["python"])
    return cell_id(cell.identity, env), env
