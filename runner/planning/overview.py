"""What ``matrun plan`` and ``matrun status`` show: the matrix joined with earlier runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from matrun.runner.environments.system import system_refusal
from matrun.runner.executors.registry import get_executor
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.planning.history import done_runs, durations
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.planning.params import as_text
from matrun.runner.planning.selection import parse_where, select
from matrun.warehouse.bundles.layout import RESULT


def plan_rows(*, matrix_path: Path, where: Sequence[str] = (), profile: str | None = None,
              overrides: Mapping[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per selected cell, and a footer with counts, the time estimate and
    ``unrunnable``: "cell <id> (<label>): <reason>" for each ``variant = "system"`` cell whose
    interpreter cannot run it (too old, the framework missing), which a sweep refuses.

    A row holds each varying parameter's value as text, ``-`` where the cell does not use it.
    """
    matrix = load_matrix(matrix_path, profile, overrides)
    runner, _ = get_executor(matrix.sweep.executor)
    cells = select(plan_cells(matrix, runner.env_id), parse_where(where))
    done = done_runs(matrix.sweep.warehouse)
    known = durations(matrix.sweep.warehouse)
    repeats = matrix.sweep.repeats
    varying = list(matrix.cells[0].varying) if matrix.cells else []
    rows, todo, estimate, have_estimate = [], 0, 0.0, False
    mean = sum(known.values()) / len(known) if known else None
    for pc in cells:
        n_done = sum(1 for r in range(repeats) if done.get((pc.cell_id, r), {}).get("ok"))
        cell_est = known.get(pc.cell_id, mean)
        missing = repeats - n_done
        todo += missing
        if cell_est is not None:
            estimate += cell_est * missing
            have_estimate = True
        rows.append({"cell_id": pc.cell_id, "env_id": pc.env_id, "done": n_done,
                     "estimate_s": known.get(pc.cell_id),
                     **{k: _shown(pc.cell.values[k]) for k in varying}})
    unrunnable = [f"cell {pc.cell_id} ({pc.cell.label}): {reason}" for pc in cells
                  if pc.cell.values["variant"] == SYSTEM_VARIANT
                  and (reason := system_refusal(pc.cell.values["framework"], pc.cell.values["python"]))]
    footer = {"cells": len(cells), "repeats": repeats, "runs": len(cells) * repeats,
              "done": len(cells) * repeats - todo, "todo": todo, "varying": varying,
              "estimate_s": estimate if have_estimate and todo else None, "unrunnable": unrunnable,
              # [sweep] rerun_busy and busy_reruns: re-runs a repeat that starts busy may get
              "busy_reruns": matrix.sweep.busy_reruns if matrix.sweep.rerun_busy else 0}
    return rows, footer


def _shown(value: Any) -> str:
    """A parameter's value in the plan's table: ``-`` where the cell does not use it (null)."""
    return "-" if value is None else as_text(value)


def status_rows(*, matrix_path: Path, profile: str | None = None,
                overrides: Mapping[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per cell: ok repeats, last status, attempts; and totals by state."""
    matrix = load_matrix(matrix_path, profile, overrides)
    runner, _ = get_executor(matrix.sweep.executor)
    cells = plan_cells(matrix, runner.env_id)
    done = done_runs(matrix.sweep.warehouse)
    incomplete = _incomplete(matrix.sweep.results / matrix.sweep.name)
    counts = {"sweep": matrix.sweep.name, "repeats": matrix.sweep.repeats,
              "cells": len(cells), "complete": 0, "partial": 0, "not started": 0, "unfinished bundles": 0}
    rows = []
    for pc in cells:
        states = [done.get((pc.cell_id, r)) for r in range(matrix.sweep.repeats)]
        ok = sum(1 for s in states if s and s["ok"])
        seen = [s for s in states if s]
        last = seen[-1]["last_status"] if seen else "-"
        if pc.cell_id in incomplete:
            last = f"{last} (+unfinished)"
            counts["unfinished bundles"] += incomplete[pc.cell_id]
        counts["complete" if ok == matrix.sweep.repeats else "partial" if seen else "not started"] += 1
        rows.append({"cell_id": pc.cell_id, "label": pc.cell.label, "ok": ok, "last_status": last,
                     "attempts": sum(s["attempts"] for s in seen)})
    return rows, counts


def _incomplete(sweep_dir: Path) -> dict[str, int]:
    """cell_id → bundles on disk without result.json (running now, or killed)."""
    found: dict[str, int] = {}
    if sweep_dir.is_dir():
        for spec in sweep_dir.glob("*/*/spec.json"):
            if not (spec.parent / RESULT).exists():
                cell = spec.parent.parent.name
                found[cell] = found.get(cell, 0) + 1
    return found
