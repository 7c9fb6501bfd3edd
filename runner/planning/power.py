"""Power before running: ``matrun plan --detect RATIO`` (docs/CLI.md "plan").

How many repeats a comparison needs to detect a ratio of throughputs depends on how much the
runs vary on this host.  The warehouse already knows: each cell's coefficient of variation of
throughput (``cell_stats.throughput_cv``).  A planned cell takes its own when it has at least
``MIN_RUNS`` ok runs, else the median of the cells of its framework, model and dataset, else the
median of every cell; then ``runner/planning/sequential.py`` simulates, on log-normal values
with that CV, the power of the sweep's design (fixed or adaptive) and the fewest repeats a
fixed design needs for ``TARGET`` power.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from matrun.errors import InputError
from matrun.runner.planning.sequential import design, repeats_needed, simulate

#: A cell's own CV counts from this many ok runs.
MIN_RUNS = 3
#: The power a design should reach.
TARGET = 0.8
#: Draws per simulated design (enough for a plan: power to about ±1.5 %).
DRAWS = 1500


def check_detect(value: float | None) -> float | None:
    """``--detect``: an effect above 1 (a ratio of throughputs)."""
    if value is None:
        return None
    if not value > 1 or value != value or value == float("inf"):
        raise InputError(f"--detect: expected an effect above 1 (e.g. 1.1 for 10 %), got {value:g}")
    if value > 100:
        raise InputError(f"--detect: expected an effect of at most 100 (a ratio of throughputs), got {value:g}")
    return value


def measured_cvs(warehouse: Path) -> list[dict[str, Any]]:
    """The warehouse's cells with a throughput CV: cell_id, framework, model, dataset, n, cv
    (read-only; [] without a warehouse)."""
    if not warehouse.exists():
        return []
    from matrun.warehouse.db import open_warehouse  # duckdb: only when asked

    with open_warehouse(warehouse, read_only=True, wait_s=30) as wh:
        rows = wh.con.execute(
            "SELECT cell_id, framework, model, dataset, throughput_n, throughput_cv FROM cell_stats "
            "WHERE throughput_cv IS NOT NULL AND isfinite(throughput_cv) AND throughput_n >= 2").fetchall()
    return [dict(zip(("cell_id", "framework", "model", "dataset", "n", "cv"), r)) for r in rows]


@dataclass(frozen=True)
class CellNoise:
    cell_id: str
    cv: float
    source: str  # "own runs" | "framework, model, dataset" | "every cell"


def cell_noise(cells: Sequence[Any], known: list[dict[str, Any]]) -> list[CellNoise]:
    """Each planned cell's CV (``cells``: PlannedCell); [] when the warehouse has none."""
    if not known:
        return []
    own = {r["cell_id"]: r["cv"] for r in known if r["n"] >= MIN_RUNS}
    groups: dict[tuple, list[float]] = {}
    for r in known:
        groups.setdefault((r["framework"], r["model"], r["dataset"]), []).append(r["cv"])
    overall = statistics.median(r["cv"] for r in known)
    out = []
    for pc in cells:
        v = pc.cell.values
        if pc.cell_id in own:
            out.append(CellNoise(pc.cell_id, own[pc.cell_id], "own runs"))
        elif (key := (v.get("framework"), v.get("model"), v.get("dataset"))) in groups:
            out.append(CellNoise(pc.cell_id, statistics.median(groups[key]), "framework, model, dataset"))
        else:
            out.append(CellNoise(pc.cell_id, overall, "every cell"))
    return out


@dataclass(frozen=True)
class PowerLine:
    cv: float
    cells: int
    power: float
    mean_repeats: float
    fixed_needed: int | None


def power_lines(noise: list[CellNoise], ratio: float, lo: int, hi: int) -> list[PowerLine]:
    """Per CV (rounded to 1 %): the design ``lo``..``hi``'s power and mean repeats at ``ratio``,
    and the repeats a fixed design needs for TARGET power."""
    by_cv: dict[float, int] = {}
    for n in noise:
        key = max(round(n.cv, 2), 0.005)
        by_cv[key] = by_cv.get(key, 0) + 1
    d = design(lo, hi)
    lines = []
    for cv, count in sorted(by_cv.items()):
        p = simulate(d, ratio, cv, draws=DRAWS)
        lines.append(PowerLine(cv, count, p.power, p.mean_repeats,
                               repeats_needed(ratio, cv, TARGET, draws=DRAWS // 2)))
    return lines
