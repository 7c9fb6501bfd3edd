"""The ``matrun`` command line.  Thin: each command parses flags and calls a library function.

Errors from the library (``MatrunError``) are printed here, once, as ``Error: …`` with exit
code 2 for bad input and 1 for failures.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from matrun.errors import InputError, MatrunError

app = typer.Typer(
    name="matrun",
    help="Run deep-learning benchmark matrices, keep every run in DuckDB, report with SQL and Plotly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

MatrixArg = Annotated[Path, typer.Argument(help="The matrix file.", show_default=True)]
WhereOpt = Annotated[list[str], typer.Option(
    "--where", "-w", help="Only cells whose parameter has one of these values: KEY=V[,V…] "
    "(repeatable; KEY may be 'cell' for a cell-id prefix).")]
WarehouseOpt = Annotated[Optional[Path], typer.Option(
    "--warehouse", help="DuckDB file (default: the one matrix.toml names, else ./matrun.duckdb).")]


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MatrunError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def _warehouse(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit
    default_matrix = Path("matrix.toml")
    if default_matrix.is_file():
        from matrun.runner.planning.matrix import load_matrix

        return load_matrix(default_matrix).sweep.warehouse
    return Path("matrun.duckdb")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    value = int(round(value))
    return f"{value // 3600}h{value % 3600 // 60:02d}m" if value >= 3600 else f"{value // 60}m{value % 60:02d}s"


@app.command()
@_errors
def plan(
    matrix: MatrixArg = Path("matrix.toml"),
    where: WhereOpt = [],
) -> None:
    """Show the cells of a matrix: parameters that vary, id, repeats done, time estimate."""
    from matrun.runner.planning.overview import plan_rows

    rows, footer = plan_rows(matrix_path=matrix, where=where)
    table = Table(title=f"{matrix}: {footer['cells']} cells × {footer['repeats']} repeats", show_lines=False)
    for col in ("cell", *footer["varying"], "env", "done", "estimate"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["cell_id"], *[str(row[k]) for k in footer["varying"]], row["env_id"],
                      f"{row['done']}/{footer['repeats']}", _seconds(row["estimate_s"]))
    out.print(table)
    if not footer["todo"]:
        rest = "nothing left to run"
    elif footer["estimate_s"]:
        rest = f"estimated time for the rest: {_seconds(footer['estimate_s'])}"
    else:
        rest = "estimated time for the rest: unknown (no earlier runs)"
    typer.echo(f"{footer['runs']} runs: {footer['done']} done, {footer['todo']} to run; {rest}")


@app.command()
@_errors
def sweep(
    matrix: MatrixArg = Path("matrix.toml"),
    where: WhereOpt = [],
    force: Annotated[bool, typer.Option("--force", help="Run again even the cells that already have an ok run.")] = False,
    executor: Annotated[Optional[str], typer.Option(help="auto, local, docker or slurm (default: the matrix's [sweep] "
        "executor; auto: docker when a Docker engine answers, else local).")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Slurm: submit and return; a later `matrun sweep` "
        "or `matrun ingest` picks the results up, `matrun cancel` stops the jobs.")] = False,
    partition: Annotated[Optional[str], typer.Option(help="Slurm partition (overrides \\[slurm] partition).")] = None,
    account: Annotated[Optional[str], typer.Option(help="Slurm account (overrides \\[slurm] account).")] = None,
    qos: Annotated[Optional[str], typer.Option(help="Slurm QOS (overrides \\[slurm] qos).")] = None,
    throttle: Annotated[Optional[int], typer.Option(help="Slurm: at most this many tasks of a job array at once "
        "(0: no limit; overrides \\[slurm] throttle).")] = None,
    exclusive: Annotated[Optional[bool], typer.Option("--exclusive/--no-exclusive", help="Slurm: whether each task "
        "has its node to itself (default: \\[slurm] exclusive, true).")] = None,
    sbatch_arg: Annotated[list[str], typer.Option("--sbatch-arg", help="Slurm: one more sbatch flag, --name=value, "
        "from the allowed set (repeatable; replaces \\[slurm] sbatch_args).")] = [],
) -> None:
    """Run every cell that has no successful run yet, ingest each run as it ends."""
    from matrun.runner.sweep import run_sweep

    signal.signal(signal.SIGTERM, _sigterm)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err,
                        disable=not err.is_terminal)
    task = None

    def on_event(event: Any) -> None:
        nonlocal task
        if event.kind == "message":
            typer.echo(event.text, err=True)
        elif event.kind == "plan":
            note = f" (estimated {_seconds(event.estimate_s)})" if event.estimate_s else ""
            typer.echo(f"{event.text}{note}", err=True)
            task = progress.add_task("sweep", total=event.total)
            progress.start()
        elif event.kind == "run-start":
            progress.update(task, description=f"{event.cell.cell.label} #{event.repeat}")
        elif event.kind == "run-end":
            o = event.outcome
            progress.advance(task)
            line = f"{o.status:>9}  {event.cell.cell_id}  repeat {event.repeat}  {o.wall_seconds:7.1f}s  {event.cell.cell.label}"
            progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

    slurm = {"partition": partition, "account": account, "qos": qos, "throttle": throttle,
             "exclusive": exclusive, "sbatch_args": sbatch_arg or None}
    try:
        summary = run_sweep(matrix_path=matrix, where=where, force=force, executor=executor, on_event=on_event,
                            detach=detach, slurm=slurm)
    finally:
        progress.stop()
    for line in summary.warnings:
        typer.echo(f"warning: {line}", err=True)
    if summary.detached:
        jobs = f" as Slurm job {', '.join(summary.job_ids)}" if summary.job_ids else ""
        waiting = f"; {summary.in_flight} already queued or running" if summary.in_flight else ""
        typer.echo(f"sweep {summary.sweep}: submitted {summary.submitted} runs{jobs}{waiting}; "
                   f"{summary.skipped_done} already done. `matrun status` shows progress, `matrun sweep` or "
                   f"`matrun ingest` picks the results up, `matrun cancel` stops the jobs")
        return
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary.by_status.items())) or "nothing to run"
    typer.echo(f"sweep {summary.sweep}: {summary.ran} runs ({counts}); {summary.skipped_done} already done")
    for line in summary.not_ingested:
        typer.echo(f"warning: not ingested: {line} (the bundle is on disk; run `matrun ingest`)", err=True)
    if summary.by_status.get("ok", 0) < summary.ran:
        raise typer.Exit(1)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # stop the running cell, record it as cancelled, keep the rest


@app.command()
@_errors
def status(matrix: MatrixArg = Path("matrix.toml")) -> None:
    """Show, per cell of the matrix, how many repeats are done and how the last run ended."""
    from matrun.runner.planning.overview import status_rows

    from matrun.runner.slurm.executor import cell_progress
    from matrun.runner.planning.matrix import load_matrix

    rows, counts = status_rows(matrix_path=matrix)
    m = load_matrix(matrix)
    progress = cell_progress(m.sweep.results / m.sweep.name)  # None: no Slurm submissions
    table = Table(title=f"{matrix}: sweep {counts['sweep']}")
    slurm_cols = ("queued", "running", "done", "failed") if progress else ()
    for col in ("cell", "label", "ok repeats", "last status", "attempts", *slurm_cols):
        table.add_column(col)
    totals = dict.fromkeys(slurm_cols, 0)
    for r in rows:
        extra = []
        if progress:
            cell = progress[0].get(r["cell_id"], {})
            extra = [str(cell.get(c, 0)) for c in slurm_cols]
            for c in slurm_cols:
                totals[c] += cell.get(c, 0)
        table.add_row(r["cell_id"], r["label"], f"{r['ok']}/{counts['repeats']}", r["last_status"],
                      str(r["attempts"]), *extra)
    out.print(table)
    typer.echo(", ".join(f"{k}: {v}" for k, v in counts.items() if k not in ("sweep",)))
    if progress:
        typer.echo("Slurm tasks: " + ", ".join(f"{k}: {v}" for k, v in totals.items()))
        for note in progress[1]:
            typer.echo(f"note: {note}", err=True)


@app.command()
@_errors
def cancel(
    matrix: MatrixArg = Path("matrix.toml"),
    wait: Annotated[float, typer.Option(help="Seconds to wait for the tasks to stop their containers.")] = 180.0,
) -> None:
    """Cancel the sweep's Slurm jobs (scancel); record and ingest the runs they stopped."""
    from matrun.runner.sweep import cancel_sweep

    result = cancel_sweep(matrix_path=matrix, wait_s=wait, on_message=lambda text: typer.echo(text, err=True))
    if not result["job_ids"]:
        typer.echo(f"sweep {result['sweep']}: no queued or running Slurm job; nothing to cancel")
        return
    typer.echo(f"sweep {result['sweep']}: cancelled Slurm job {', '.join(result['job_ids'])}; "
               f"{result['recorded']} run(s) recorded as cancelled; {result['left']} task(s) still ending")
    if not result["ended"] or result["left"]:
        raise typer.Exit(1)


@app.command()
@_errors
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Result directories or bundles to load.")],
    warehouse: WarehouseOpt = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for another writer to finish.")] = 0.0,
) -> None:
    """Load result bundles from disk into the warehouse (idempotent)."""
    from matrun.warehouse.ingest import ingest as do_ingest

    from matrun.runner.slurm.executor import reconcile

    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: no such file or directory")
    written, notes = reconcile(paths)  # runs Slurm ended without a result.json get one from Slurm's state
    if written:
        typer.echo(f"recorded {written} run(s) Slurm ended from Slurm's state", err=True)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    report = do_ingest(paths, warehouse=_warehouse(warehouse), wait_s=wait)
    typer.echo(report.summary())
    for path, reason in report.skipped:
        typer.echo(f"skipped {path}: {reason}", err=True)
    for path in report.incomplete:
        typer.echo(f"incomplete (no result.json yet): {path}", err=True)


@app.command()
@_errors
def query(
    sql: Annotated[str, typer.Argument(help="One SQL statement, read-only (e.g. \"SELECT * FROM baseline\").")],
    warehouse: WarehouseOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")] = "table",
) -> None:
    """Run SQL over the warehouse (read-only) and print the result."""
    from matrun.warehouse.query import run_query

    if fmt not in ("table", "csv", "json"):
        raise InputError(f"--format {fmt!r}: expected table, csv or json")
    columns, rows = run_query(sql, warehouse=_warehouse(warehouse))
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(columns)
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
    elif fmt == "json":
        sys.stdout.write(json.dumps([dict(zip(columns, r)) for r in rows], default=str, indent=2) + "\n")
    else:
        table = Table()
        for c in columns:
            table.add_column(str(c), overflow="fold")
        for r in rows:
            table.add_row(*["NULL" if v is None else str(v) for v in r])
        out.print(table)
        typer.echo(f"{len(rows)} rows")


@app.command()
@_errors
def report(
    warehouse: WarehouseOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Directory to write the static site into (default: report, unless --publish is given).")] = None,
    run: Annotated[Optional[str], typer.Option(help="Run id whose CPU and memory time series to show.")] = None,
    sweep_name: Annotated[Optional[str], typer.Option("--sweep", help="Only this sweep.")] = None,
    publish: Annotated[Optional[Path], typer.Option(
        "--publish", help="Also (or, without --out, only) write a copy for a public static host into "
        "this directory: relative links only, absolute paths in the data cut to their last part.")] = None,
) -> None:
    """Write the static HTML report (works from file://) and print where it is."""
    from matrun.reports.build import build_report

    wh = _warehouse(warehouse)
    if out_dir is not None or publish is None:
        index = build_report(warehouse=wh, out_dir=out_dir or Path("report"), run_id=run, sweep=sweep_name)
        typer.echo(f"report: {index.resolve()}")
    if publish is not None:
        index = build_report(warehouse=wh, out_dir=publish, run_id=run, sweep=sweep_name, publish=True)
        typer.echo(f"published: {index.resolve()}")


@app.command()
@_errors
def envs(
    matrix: MatrixArg = Path("matrix.toml"),
    build: Annotated[bool, typer.Option("--build", help="Build the environments the matrix needs.")] = False,
) -> None:
    """List the framework environments built here; --build prepares those the matrix needs."""
    from matrun.runner.environments.venvs import ensure_env, list_envs
    from matrun.runner.planning.matrix import load_matrix

    if build:
        m = load_matrix(matrix)
        for fw, variant in sorted({(c.values["framework"], c.values["variant"]) for c in m.cells}):
            env = ensure_env(fw, variant, log=lambda t: typer.echo(t, err=True))
            typer.echo(f"{env.spec.env_id}: {env.path}")
    table = Table(title="environments")
    for col in ("env id", "framework", "variant", "version", "python", "path"):
        table.add_column(col)
    for e in list_envs():
        table.add_row(e["env_id"], e["framework"], e["variant"], e.get("framework_version", ""), e["python"], e["path"])
    out.print(table)


from matrun.runner.cli.data import data_app  # noqa: E402  (after _errors, which it uses)
from matrun.runner.cli.images import build as _build, engine_app, images as _images  # noqa: E402
from matrun.runner.cli.analysis import advise as _advise, compare as _compare  # noqa: E402

app.add_typer(data_app, name="data")
app.command("build")(_errors(_build))
app.command("images")(_errors(_images))
app.command("compare")(_errors(_compare))
app.command("advise")(_errors(_advise))
for _command in engine_app.registered_commands:
    _command.callback = _errors(_command.callback)
app.add_typer(engine_app, name="engine")
from matrun.runner.cli.slurm import slurm_app  # noqa: E402

for _command in slurm_app.registered_commands:
    _command.callback = _errors(_command.callback)
app.add_typer(slurm_app, name="slurm")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
