"""What ``matrun plan`` and ``matrun status`` show: the matrix joined with earlier runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from matrun.runner.environments.system import system_refusal
from matrun.runner.executors.registry import get_executor
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.environments.releases import check_releases
from matrun.runner.planning.history import done_runs, durations
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.planning.params import as_text
from matrun.runner.planning.power import TARGET, cell_noise, measured_cvs, power_lines
from matrun.runner.planning.sequential import can_decide, design
from matrun.runner.planning.selection import parse_where, select
from matrun.warehouse.bundles.layout import RESULT


def plan_rows(*, matrix_path: Path, where: Sequence[str] = (), profile: str | None = None,
              overrides: Mapping[str, Any] | None = None, repeats: Mapping[str, Any] | None = None,
              detect: float | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per selected cell, and a footer with counts, the time estimate and
    ``unrunnable``: "cell <id> (<label>): <reason>" for each ``variant = "system"`` cell whose
    interpreter cannot run it (too old, the framework missing), which a sweep refuses.

    A row holds each varying parameter's value as text, ``-`` where the cell does not use it.
    """
    matrix = load_matrix(matrix_path, profile, overrides)
    if repeats:  # --repeats / --max-time (matrix.repeats_option)
        matrix = replace(matrix, sweep=replace(matrix.sweep, **repeats))
    runner, _ = get_executor(matrix.sweep.executor)
    cells = select(plan_cells(matrix, runner.env_id), parse_where(where))
    check_releases(pc.params for pc in cells)  # a release the index lacks: refused now, by name
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
    footer.update(_design(matrix, cells, done, known, mean, detect))
    return rows, footer


def _design(matrix: Any, cells: Sequence[Any], done: Mapping[tuple[str, int], Any], known: Mapping[str, float],
            mean: float | None, detect: float | None) -> dict[str, Any]:
    """The plan's words on the sweep's repeats: an adaptive design's range, level, runs and
    estimate at most; a study whose verdicts can never be significant; ``--detect``'s power."""
    lo, hi = matrix.sweep.repeats, matrix.sweep.repeats_max or matrix.sweep.repeats
    d = design(lo, hi)
    out: dict[str, Any] = {"repeats_max": matrix.sweep.repeats_max, "max_time": matrix.sweep.max_time,
                           "level": d.level, "warnings": []}
    if matrix.sweep.repeats_max:
        extra = sum(1 for pc in cells for r in range(lo, hi) if not done.get((pc.cell_id, r), {}).get("ok"))
        out["runs_max"] = len(cells) * hi
        out["todo_max"] = extra
        out["estimate_max_s"] = (sum(known.get(pc.cell_id, mean or 0.0) * sum(
            1 for r in range(lo, hi) if not done.get((pc.cell_id, r), {}).get("ok")) for pc in cells)
            if mean is not None else None)
    if matrix.study is not None and not can_decide(hi, hi, d.level):
        out["warnings"].append(
            f"study {matrix.study.id}: with {hi} repeats no verdict can ever be significant ({hi} against {hi} runs "
            f"cannot reach p < {d.level:g}): every finding will read 'not significant'; run at least 4 repeats")
    if detect is not None:
        noise = cell_noise(cells, measured_cvs(matrix.sweep.warehouse))
        out["detect"] = detect
        out["power"] = power_lines(noise, detect, lo, hi) if noise else []
        weak = [line for line in out["power"] if line.power < TARGET]
        if weak:
            worst = max(weak, key=lambda line: line.cv)
            fix = (f"at that CV a fixed design needs {worst.fixed_needed} repeats" if worst.fixed_needed
                   else "at that CV no design of at most 100 repeats reaches it")
            out["warnings"].append(
                f"--detect {detect:g}: {_design_words(lo, hi)} cannot reach {TARGET:.0%} power for "
                f"{sum(line.cells for line in weak)} of {len(cells)} cells (their CV {_span([l.cv for l in weak])}; "
                f"power down to {min(l.power for l in weak):.0%}); {fix}")
    return out


def _span(cvs: list[float]) -> str:
    lo, hi = min(cvs), max(cvs)
    return f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%} to {hi:.0%}"


def _design_words(lo: int, hi: int) -> str:
    return f"{lo}–{hi} repeats (adaptive)" if hi > lo else f"{lo} repeats"


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
