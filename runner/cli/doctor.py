"""``matrun doctor``: this host checked against what a matrix needs, and what to fix.

A thin wrapper over ``runner/doctor/report.py`` (``doctor``); docs/CLI.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from matrun.errors import MatrunError
from matrun.runner.cli.common import MatrixArg, ProfileOpt, WhereOpt, app, command
from matrun.runner.doctor.checks import Check
from matrun.runner.doctor.report import doctor as check_host


@command(app)
def doctor(
    matrix: MatrixArg = Path("matrix.toml"),
    profile: ProfileOpt = None,
    where: WhereOpt = [],
    executor: Annotated[Optional[str], typer.Option(help="auto, local, docker or slurm: the executor to check "
        "for (default: the matrix's \\[sweep] executor; auto: docker when a Docker engine answers, else local).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document (ok, executor, cells, "
        "failures, warnings, checks) on stdout instead of the lines.")] = False,
) -> None:
    """Check this host against what the matrix needs (engine, GPUs, Slurm, data, images, disk); exit 1 with the failures."""
    report = check_host(matrix_path=matrix, executor=executor, where=where, profile=profile)
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        width = max(len(c.name) for c in report.checks)
        for check in report.checks:
            _print_check(check, width)
        verdict = "can run here" if report.ok else "cannot run here"
        typer.echo(f"{matrix}: {report.cells} cell(s), executor {report.executor}: {verdict} "
                   f"({len(report.failures)} failed, {len(report.warnings)} warning(s), "
                   f"{len(report.checks)} checks)")
    if not report.ok:
        names = ", ".join(c.name for c in report.failures)
        raise MatrunError(f"{len(report.failures)} check(s) failed: {names}")


def _print_check(check: Check, width: int) -> None:
    typer.echo(f"{check.status.upper():<4}  {check.name:<{width}}  {check.found}")
    if check.fix and check.status != "ok":
        typer.echo(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
