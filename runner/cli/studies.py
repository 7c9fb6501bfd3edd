"""``matrun studies``: the study catalogue (``runner/planning/studies.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from matrun.runner.cli.common import app, check_format, command, duration_text, out, resolve_warehouse
from matrun.runner.planning.studies import catalogue


def _estimate(value: float | None) -> str:
    return "unknown" if value is None else f"≈{duration_text(value)}"


@command(app)
def studies(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The folder of study files.")] = Path("studies"),
    warehouse: Annotated[Optional[Path], typer.Option(
        "--warehouse", metavar="DIR", help="The warehouse whose earlier runs the estimates come from "
        "(default: the one matrix.toml names, else ./matrun.duckdb).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table or json.")] = "table",
) -> None:
    """List the study catalogue: id, seed and table, what varies, device needs, runs and an
    estimated time per profile (`matrun sweep FILE --profile NAME` runs one)."""
    check_format(fmt, ("table", "json"))
    entries = catalogue(directory, warehouse=resolve_warehouse(warehouse))
    if fmt == "json":
        rows = [{"file": str(e.path), "id": e.id, "title": e.title, "seed": e.seed, "source": e.source,
                 "needs": e.needs, "varies": list(e.varying), "findings": list(e.findings), "error": e.error,
                 "profiles": [{"name": p.name, "about": p.about, "cells": p.cells, "runs": p.runs,
                               "estimate_s": p.estimate_s, "basis": p.basis, "gpus": p.needs_gpus}
                              for p in e.profiles]} for e in entries]
        typer.echo(json.dumps(rows, indent=2))
    else:
        table = Table(title=f"{directory}: {len(entries)} studies", show_lines=True)
        for col in ("id", "file", "seed · table", "varies", "profile", "needs", "runs", "estimate"):
            table.add_column(col, overflow="fold")
        for e in entries:
            if e.error:
                continue
            table.add_row(*map(escape, (
                e.id, e.path.name, f"{e.seed} · {e.source}", ", ".join(e.varying) or "-",
                "\n".join(p.name for p in e.profiles),
                "\n".join(f"gpu ×{p.needs_gpus}" if p.needs_gpus else "cpu" for p in e.profiles),
                "\n".join(f"{p.cells} × {p.runs // max(p.cells, 1)} = {p.runs}" for p in e.profiles),
                "\n".join(_estimate(p.estimate_s) for p in e.profiles))))
        out.print(table)
        for e in entries:
            if e.error:
                typer.echo(f"cannot read {e.path}: {e.error}", err=True)
        bad = sum(1 for e in entries if e.error)
        typer.echo(f"{len(entries) - bad} studies, {bad} unreadable; `matrun sweep FILE --profile quick` runs "
                   "one quickly, `matrun plan FILE --profile NAME` lists its cells; estimates: earlier runs in "
                   "the warehouse, else unknown")
    if any(e.error for e in entries):
        raise typer.Exit(1)
