"""Adaptive repeats (``[sweep] repeats = { min, max, max_time }``; docs/MATRIX.md "Adaptive
repeats"): after every cell has ``min`` repeats, the sweep looks at the verdicts its cells take
part in and adds one repeat, in rounds interleaved as every sweep's, only to the cells of a
verdict that is still undecided, until each is decided, ``max`` repeats are reached or
``max_time`` seconds have passed since the sweep began.

The verdicts looked at are the warehouse's own, read after the round's runs are ingested:
the study's ``findings`` (a row whose verdict is 'not significant': its cell and reference
cell) and ``best_vs_default`` (``matrun advise``: a framework's best cell against its default
one, 'not significant').  Every run of an adaptive sweep records its design's nominal level
(result.json ``design``), and the views compare its cells at that level
(runner/planning/sequential.py): the stopping rule and the verdict are the same test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrun.runner.planning.matrix import Matrix
from matrun.runner.planning.sequential import Design, design


def sweep_design(matrix: Matrix) -> Design | None:
    """The sweep's adaptive design, None for fixed repeats."""
    if not matrix.sweep.repeats_max:
        return None
    return design(matrix.sweep.repeats, matrix.sweep.repeats_max)


def design_record(d: Design | None) -> dict[str, Any] | None:
    """result.json ``design`` of a run of an adaptive sweep (None: fixed repeats)."""
    if d is None:
        return None
    return {"repeats_min": d.min, "repeats_max": d.max, "level": d.level, "alpha": 0.05,
            "boundary": "pocock-exact-mann-whitney"}


@dataclass(frozen=True)
class Undecided:
    """A verdict the sweep's cells take part in that is not decided yet."""

    what: str          # "finding <id>" or "advise <framework>"
    cells: tuple[str, ...]
    ratio: float | None
    low: float | None
    high: float | None

    @property
    def key(self) -> str:
        return f"{self.what} {' '.join(self.cells)}"


def undecided(warehouse: Path, study: str | None, cells: set[str]) -> list[Undecided]:
    """The undecided verdicts with a cell among ``cells`` (read-only; [] when the warehouse
    has none of the views yet)."""
    from matrun.warehouse.compare import reader  # duckdb: imported where a sweep looks

    found: list[Undecided] = []
    with reader(warehouse) as con:
        if study is not None:
            rows = con.execute(
                "SELECT finding, cell_id, ref_cell_id, ratio, ratio_low, ratio_high FROM findings "
                "WHERE study = ? AND verdict = 'not significant' ORDER BY finding, cell_id",
                [study]).fetchall()
            for finding, a, b, ratio, low, high in rows:
                pair = tuple(c for c in (a, b) if c in cells)
                if pair:
                    found.append(Undecided(f"finding {finding}", pair, ratio, low, high))
        rows = con.execute(
            "SELECT framework, best_cell_id, default_cell_id, speedup, speedup_low, speedup_high "
            "FROM best_vs_default WHERE verdict = 'not significant' ORDER BY framework").fetchall()
        for framework, a, b, ratio, low, high in rows:
            pair = tuple(c for c in (a, b) if c in cells)
            if pair:
                found.append(Undecided(f"advise {framework}", pair, ratio, low, high))
    return found


def describe(items: list[Undecided]) -> str:
    """``finding threads-speed-up 1.39× (0.9–2.1); advise jax 1.20× (0.95–1.5)``"""
    parts = []
    for u in items[:6]:
        text = u.what
        if u.ratio is not None:
            text += f" {u.ratio:.2f}×"
            if u.low is not None and u.high is not None:
                text += f" ({u.low:.2f}–{u.high:.2f})"
        parts.append(text)
    if len(items) > 6:
        parts.append(f"… {len(items) - 6} more")
    return "; ".join(parts)
