"""``matrun bisect``: the release of a framework where a workload became slower
(runner/sweep/bisect.py; docs/RELEASES.md "Bisect")."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from matrun.errors import InputError, MatrunError
from matrun.runner.cli.common import (
    MatrixArg, ProfileOpt, SetOpt, WhereOpt, app, check_format, command, err, out,
)
from matrun.runner.cli.progress import SweepDisplay
from matrun.runner.environments.releases import offered_releases
from matrun.runner.executors.registry import get_executor
from matrun.runner.harness.spec import RELEASE
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix, repeats_option
from matrun.runner.planning.overrides import parse_overrides
from matrun.runner.planning.params import as_text
from matrun.runner.planning.selection import parse_where
from matrun.runner.sweep import bisect as bis
from matrun.runner.sweep.run import run_sweep
from matrun.warehouse import history as hist
from matrun.warehouse.compare import fetch, fmt_num, fmt_p, fmt_ratio_ci, reader

EXECUTORS = ("local", "slurm")


@command(app)
def bisect(
    matrix: MatrixArg = Path("matrix.toml"),
    good: Annotated[str, typer.Option("--good", metavar="RELEASE", help="A release of the framework where the "
                                      "workload was fast.")] = "",
    bad: Annotated[str, typer.Option("--bad", metavar="RELEASE", help="A release where it is slow.")] = "",
    profile: ProfileOpt = None,
    where: WhereOpt = [],
    sets: SetOpt = [],
    metric: Annotated[str, typer.Option("--metric", metavar="METRIC", help="throughput, train_s, test_s or "
                                        "tokens_per_second.")] = "throughput",
    repeats: Annotated[str, typer.Option("--repeats", metavar="N", help="Runs per release measured.")] = "5",
    executor: Annotated[str, typer.Option("--executor", help="local or slurm (with [slurm] runtime = \"local\"): "
                                          "release cells run in matrun's environments.")] = "local",
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table or json.")] = "table",
) -> None:
    """Find the release of a framework where one workload (a cell of MATRIX, without version)
    became slower, measuring only the releases a binary search needs."""
    check_format(fmt, ("table", "json"))
    if metric not in ("throughput", "train_s", "test_s", "tokens_per_second"):
        raise InputError(f"--metric: expected throughput, train_s, test_s or tokens_per_second, got {metric!r}")
    if executor not in EXECUTORS:
        raise InputError(f"--executor: expected local or slurm (the docker executor has no image per release), "
                         f"got {executor!r}")
    for option, value in (("--good", good), ("--bad", bad)):
        if not value:
            raise InputError(f"{option} is missing: bisect needs a good and a bad release, e.g. --good 2.4.1 "
                             "--bad 2.13.0")
    fields = repeats_option(repeats)
    n = fields.get("repeats")
    if not isinstance(n, int) or n < 2 or fields.get("repeats_max") is not None:
        raise InputError(f"--repeats: expected a number of runs of at least 2 (one value decides nothing), "
                         f"got {repeats!r}")
    for option, value in (("--good", good), ("--bad", bad)):
        if not RELEASE.match(value):
            raise InputError(f'{option}: expected a release such as "2.4.1", got {value!r}')
    overrides = {k: v for k, v in parse_overrides(sets).items() if k != "version"}
    workload, label, matrix_doc = _workload(matrix, profile, where, overrides)
    framework = workload["framework"]
    _release_cell(matrix, profile, workload, good, executor)  # refused now, not after a run, if it cannot plan
    releases = bis.releases_between(offered_releases(framework), good, bad)
    display = SweepDisplay(err)
    m = hist.METRICS[metric]
    typer.echo(f"bisect {label}: {len(releases)} releases of {framework} from {releases[0]} to "
               f"{releases[-1]}, {n} runs each", err=True)

    def measure(release: str) -> list[float] | str:
        try:
            run_sweep(matrix_path=matrix, executor=executor, on_event=display, profile=profile,
                      overrides={**workload, "version": release}, repeats={"repeats": n},
                      register=False)
            cell = _release_cell(matrix, profile, workload, release, executor)
        except MatrunError as exc:
            return f"not measured: {exc}".splitlines()[0][:300]
        finally:
            display.stop()
        with reader(matrix_doc.sweep.warehouse) as con:
            rows = fetch(con, f"""
                SELECT {m.sql} AS v, coalesce(r.busy_start, false) AS busy FROM runs AS r
                WHERE r.cell_id = $cell AND r.status = 'ok' AND r."repeat" <> canary_repeat()""",
                         {"cell": cell.cell_id})
        clean = [r["v"] for r in rows if r["v"] is not None and not r["busy"]]
        return clean if len(clean) >= 2 else [r["v"] for r in rows if r["v"] is not None]

    result = bis.bisect(releases, measure, framework=framework, workload=label, metric=metric,
                        unit=m.unit, larger_is_better=m.larger_is_better,
                        log=lambda s: typer.echo(f"bisect: {s}", err=True))
    if fmt == "json":
        sys.stdout.write(json.dumps(bis.to_json_doc(result), indent=2, allow_nan=False, default=_nan) + "\n")
        return
    table = Table(title=f"{framework} {label}: {metric}{f' ({m.unit})' if m.unit else ''}")
    for col in ("release", "order", "runs", "median", "vs good", "p", "verdict"):
        table.add_column(col, overflow="fold")
    for release in releases:
        item = result.measured.get(release)
        if item is None:
            table.add_row(release, "-", "-", "-", "-", "-", "not measured")
            continue
        c = item.vs_good
        table.add_row(release, str(item.order), str(len(item.values)), fmt_num(item.median, 2),
                      fmt_ratio_ci(c.get("ratio"), c.get("ratio_low"), c.get("ratio_high"), 0.95) if c else "-",
                      fmt_p(c.get("p_value")) if c else "-",
                      f"{item.verdict} ({item.how})" if item.how else item.verdict)
    out.print(table)
    for line in bis.sentences(result):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _nan(value: Any) -> Any:
    return None


def _workload(matrix: Path, profile: str | None, where: list[str],
              overrides: dict[str, Any]) -> tuple[dict[str, Any], str, Any]:
    """The one workload bisect measures: the parameters of the selected cells but ``version``
    (which must be the same for all of them), its label and the matrix.  ``InputError`` when the selection
    holds no cell or more than one workload."""
    m = load_matrix(matrix, profile, overrides)
    wanted = parse_where(where)
    if "cell" in wanted:
        raise InputError("--where cell=…: a cell id names one release's cell; select the workload by its "
                         "parameters (--where model=resnet18)")
    chosen = [c for c in m.cells if all(as_text(c.values.get(k)) in vals for k, vals in wanted.items())]
    workloads: dict[str, dict[str, Any]] = {}
    for c in chosen:
        values = {k: v for k, v in c.values.items() if k != "version" and v is not None}
        workloads.setdefault(json.dumps(values, sort_keys=True, default=str), values)
    if not chosen:
        raise InputError("--where matches no cell of the matrix" if where else f"{matrix} has no cell")
    if len(workloads) != 1:
        labels = "; ".join(c.label for c in chosen[:5])
        raise InputError(f"bisect measures one workload: {len(workloads)} workloads among the {len(chosen)} "
                         f"cells selected ({labels}{' …' if len(chosen) > 5 else ''}); narrow them with "
                         "--where KEY=VALUE or --set KEY=VALUE")
    label = " ".join(p for p in chosen[0].label.split() if not p.startswith("version=")) or chosen[0].values["framework"]
    return next(iter(workloads.values())), label, m


def _release_cell(matrix: Path, profile: str | None, workload: dict[str, Any], release: str, executor: str) -> Any:
    """The workload's cell at ``release``: every parameter set (``--set``), so the matrix's
    axes, zips and includes all become this one cell, whose id is the sweep's."""
    m = load_matrix(matrix, profile, {**workload, "version": release})
    runner, _ = get_executor(executor)
    cells = plan_cells(m, runner.env_id)
    return cells[0]
