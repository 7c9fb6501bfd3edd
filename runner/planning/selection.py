"""Slices of a planned matrix: ``--where KEY=VALUE[,VALUE…]`` parsed and applied."""

from __future__ import annotations

from typing import Iterable, Sequence

from matrun.errors import InputError
from matrun.runner.planning.identity import PlannedCell
from matrun.runner.planning.params import PARAMS, as_text


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
    """The cells whose every ``where`` key has one of its values (``cell``: an id prefix)."""
    def keep(pc: PlannedCell) -> bool:
        for key, wanted in where.items():
            if key == "cell":
                if not any(pc.cell_id.startswith(w) for w in wanted):
                    return False
            elif as_text(pc.cell.values[key]) not in wanted:
                return False
        return True

    chosen = [pc for pc in cells if keep(pc)]
    if where and not chosen:
        raise InputError("--where matches no cell of the matrix")
    return chosen
