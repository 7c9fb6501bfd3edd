"""What earlier runs of a matrix already did, read from the warehouse's views
(``cell_status``, ``cell_durations``): which runs to skip, and how long the rest may take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matrun.warehouse.db import open_warehouse


def done_runs(warehouse: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(cell_id, repeat) → its status row, from the warehouse (empty when there is none yet)."""
    if not warehouse.exists():
        return {}
    with open_warehouse(warehouse, read_only=True, wait_s=30) as wh:
        rows = wh.con.execute(
            "SELECT cell_id, repeat, attempts, last_status, ok, max_attempt FROM cell_status").fetchall()
    return {(r[0], r[1]): {"attempts": r[2], "last_status": r[3], "ok": bool(r[4]), "max_attempt": r[5]}
            for r in rows}


def durations(warehouse: Path) -> dict[str, float]:
    """cell_id → median wall seconds of its ok runs (for estimates)."""
    if not warehouse.exists():
        return {}
    with open_warehouse(warehouse, read_only=True, wait_s=30) as wh:
        rows = wh.con.execute("SELECT cell_id, wall_seconds_median FROM cell_durations").fetchall()
    return {r[0]: float(r[1]) for r in rows if r[1] is not None}
