"""``matrun plan``, ``sweep``, ``status`` and ``cancel``: a matrix's cells, running them, their progress.

Thin wrappers over ``runner/planning/overview.py`` (plan and status rows),
``runner/sweep/run.py`` (``run_sweep``) and ``runner/slurm/`` (``cancel_sweep``, the Slurm
tasks' progress); docs/CLI.md.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from matrun.errors import BundleError
from matrun.runner.cli.common import (
    MatrixArg, ProfileOpt, SetOpt, WhereOpt, app, command, duration_text, err, out,
)
from matrun.runner.cli.progress import SweepDisplay
from matrun.runner.planning.matrix import load_matrix, repeats_option
from matrun.runner.planning.overrides import parse_overrides, spelled
from matrun.runner.planning.overview import plan_rows, status_rows
from matrun.runner.planning.power import check_detect
from matrun.runner.slurm.jobs import cell_progress
from matrun.runner.slurm.loop import cancel_sweep
from matrun.runner.sweep.records import SweepStopped, SweepSummary
from matrun.runner.sweep.run import run_sweep


@command(app)
def plan(
    matrix: MatrixArg = Path("matrix.toml"),
    profile: ProfileOpt = None,
    where: WhereOpt = [],
    sets: SetOpt = [],
    repeats: Annotated[Optional[str], typer.Option("--repeats", help="N repeats per cell, or MIN..MAX (adaptive "
        "repeats) instead of \\[sweep] repeats.")] = None,
    max_time: Annotated[Optional[float], typer.Option("--max-time", help="Adaptive repeats' time budget in "
        "seconds (instead of \\[sweep] repeats.max_time).")] = None,
    detect: Annotated[Optional[float], typer.Option("--detect", help="An effect to detect, as a ratio of "
        "throughputs (1.1: 10 %): the power of this sweep's repeats at this host's measured noise, and the "
        "repeats a fixed design needs for 80 % power.")] = None,
) -> None:
    """Show the cells of a matrix: parameters that vary, id, repeats done, time estimate."""
    overrides = parse_overrides(sets)
    repeat_fields = repeats_option(repeats, max_time)
    rows, footer = plan_rows(matrix_path=matrix, where=where, profile=profile, overrides=overrides,
                             repeats=repeat_fields, detect=check_detect(detect))
    shown = " ".join([str(matrix), *(["--profile", profile] if profile else []),
                      *([spelled(overrides)] if overrides else [])])
    how_many = (f"{footer['repeats']}–{footer['repeats_max']} repeats (adaptive)" if footer["repeats_max"]
                else f"{footer['repeats']} repeats")
    table = Table(title=f"{shown}: {footer['cells']} cells × {how_many}", show_lines=False)
    for col in ("cell", *footer["varying"], "env", "done", "estimate"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["cell_id"], *[str(row[k]) for k in footer["varying"]], row["env_id"],
                      f"{row['done']}/{footer['repeats']}", duration_text(row["estimate_s"]))
    out.print(table)
    if not footer["todo"]:
        rest = "nothing left to run"
    elif footer["estimate_s"]:
        rest = f"estimated time for the rest: {duration_text(footer['estimate_s'])}"
    else:
        rest = "estimated time for the rest: unknown (no earlier runs)"
    typer.echo(f"{footer['runs']} runs: {footer['done']} done, {footer['todo']} to run; {rest}")
    if footer["repeats_max"]:
        more = (f", up to {duration_text(footer['estimate_max_s'])} more" if footer.get("estimate_max_s") else "")
        budget = (f"; no round starts after {footer['max_time']:g} s of the sweep" if footer["max_time"] else "")
        typer.echo(f"adaptive repeats: {footer['repeats']} to {footer['repeats_max']} per cell, each look at p <= "
                   f"{footer['level']:.4f}: after {footer['repeats']}, one more repeat per round only for the cells "
                   f"of an undecided finding or advise verdict; at most {footer['runs_max']} runs "
                   f"({footer['todo_max']} beyond the first {footer['repeats']}{more}){budget}")
    if "detect" in footer:
        if not footer["power"]:
            typer.echo(f"--detect {footer['detect']:g}: the warehouse has no throughput of this host yet to measure "
                       "its noise; run a few repeats first", err=True)
        if footer["power"]:
            power = Table(title=f"--detect {footer['detect']:g}: power of {how_many} at this host's measured noise "
                                "(throughput CV of each cell, else of cells like it)")
            for col in ("CV", "cells", "power", "repeats on average", "fixed repeats for 80 %"):
                power.add_column(col, justify="right")
            for line in footer["power"]:
                power.add_row(f"{line.cv:.0%}", str(line.cells), f"{line.power:.0%}", f"{line.mean_repeats:.1f}",
                              str(line.fixed_needed) if line.fixed_needed else "over 100")
            out.print(power)
    for line in footer["warnings"]:
        typer.echo(f"warning: {line}", err=True)
    if footer["busy_reruns"]:
        typer.echo(f"busy runs: a repeat whose run starts on a busy machine runs again, up to {footer['busy_reruns']} "
                   "time(s) ([sweep] rerun_busy, busy_reruns; local and docker executors)")
    else:
        typer.echo("busy runs: not run again ([sweep] rerun_busy = false)")
    for line in footer["unrunnable"]:  # what `matrun sweep` refuses (or skips with --skip-unrunnable)
        typer.echo(f"cannot run here: {line}", err=True)
    if footer["unrunnable"]:
        typer.echo(f"note: `matrun sweep` refuses these {len(footer['unrunnable'])} cell(s) before anything runs; "
                   "--skip-unrunnable leaves them out and runs the others", err=True)


@command(app)
def sweep(
    matrix: MatrixArg = Path("matrix.toml"),
    profile: ProfileOpt = None,
    where: WhereOpt = [],
    sets: SetOpt = [],
    skip_unrunnable: Annotated[bool, typer.Option("--skip-unrunnable", help="Leave out, and list, the cells this "
        "host or executor cannot run (a site Python without their framework, say) and run the others; without it "
        "they are refused, by name, before anything runs.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Run again even the cells that already have an ok run.")] = False,
    rerun_busy: Annotated[Optional[bool], typer.Option("--rerun-busy/--no-rerun-busy", help="Run a repeat again "
        "when its run started on a busy machine, up to \\[sweep] busy_reruns times (default: \\[sweep] rerun_busy; "
        "on for study files, off otherwise).")] = None,
    repeats: Annotated[Optional[str], typer.Option("--repeats", help="N repeats per cell, or MIN..MAX: adaptive "
        "repeats (after MIN, one more repeat per round only for the cells of verdicts still undecided, up to MAX; "
        "overrides \\[sweep] repeats).")] = None,
    max_time: Annotated[Optional[float], typer.Option("--max-time", help="Adaptive repeats: start no round after "
        "this many seconds of the sweep (overrides \\[sweep] repeats.max_time).")] = None,
    executor: Annotated[Optional[str], typer.Option(help="auto, local, docker or slurm (default: the matrix's \\[sweep] "
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
    allow_skipped: Annotated[bool, typer.Option("--allow-skipped", help="Exit 0 even when bundles were skipped "
        "(damaged, in conflict, or refused by the warehouse); they are listed all the same.")] = False,
) -> None:
    """Run every cell that has no successful run yet, ingest each run as it ends."""
    overrides = parse_overrides(sets)
    repeat_fields = repeats_option(repeats, max_time)  # an InputError (exit 2) for a bad value
    signal.signal(signal.SIGTERM, _sigterm)
    display = SweepDisplay(err)  # a live progress line on a terminal, plain lines elsewhere
    slurm = {"partition": partition, "account": account, "qos": qos, "throttle": throttle,
             "exclusive": exclusive, "sbatch_args": sbatch_arg or None}
    try:
        summary = run_sweep(matrix_path=matrix, where=where, force=force, executor=executor, on_event=display,
                            detach=detach, slurm=slurm, profile=profile, overrides=overrides,
                            skip_unrunnable=skip_unrunnable, rerun_busy=rerun_busy, repeats=repeat_fields)
    except SweepStopped as stopped:  # what ran until then, then the Error line (common.py)
        display.stop()
        if stopped.summary.ran or stopped.summary.ingested or stopped.summary.skipped:
            _print_summary(stopped.summary)
        raise
    finally:
        display.stop()
    _print_summary(summary)
    if summary.failed:
        raise typer.Exit(1)
    if summary.skipped and not allow_skipped:
        raise _skipped_error(summary, load_matrix(matrix, profile, overrides).sweep.warehouse)


def _skipped_error(summary: SweepSummary, warehouse: Path) -> BundleError:
    """The sweep's error for bundles it skipped, naming the command that sets them aside: the
    ingest of their sweeps' folders with ``--quarantine`` (every later sweep skips them again)."""
    folders = sorted({str(path.parent.parent) for path in summary.skipped_paths})
    command = " ".join(["matrun ingest --quarantine --warehouse", shlex.quote(str(warehouse)),
                        *map(shlex.quote, folders)])
    return BundleError(f"{len(summary.skipped)} bundle(s) skipped (reasons above); they stay on disk and are "
                       f"not in the warehouse, and every later sweep skips them again: `{command}` sets them "
                       "aside (--allow-skipped exits 0 all the same)")


def _print_summary(summary: SweepSummary) -> None:
    """What the sweep ran (stdout), what its ingests did, and every bundle skipped (stderr)."""
    for line in summary.warnings:
        typer.echo(f"warning: {line}", err=True)
    if summary.detached:
        jobs = f" as Slurm job {', '.join(summary.job_ids)}" if summary.job_ids else ""
        waiting = f"; {summary.in_flight} already queued or running" if summary.in_flight else ""
        typer.echo(f"sweep {summary.sweep}: submitted {summary.submitted} runs{jobs}{waiting}; "
                   f"{summary.skipped_done} already done. `matrun status` shows progress, `matrun sweep` or "
                   f"`matrun ingest` picks the results up, `matrun cancel` stops the jobs")
    else:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(summary.by_status.items())) or "nothing to run"
        elsewhere = f" ({summary.done_elsewhere} by another sweep meanwhile)" if summary.done_elsewhere else ""
        busy = f"; {summary.busy_reruns} run(s) made again after a busy start" if summary.busy_reruns else ""
        if summary.adaptive_rounds:
            busy += (f"; adaptive repeats: {summary.adaptive_runs} run(s) in {summary.adaptive_rounds} round(s) for "
                     f"undecided verdicts")
        if summary.undecided:
            busy += f", {summary.undecided} still undecided"
        typer.echo(f"sweep {summary.sweep}: {summary.ran} runs ({counts}); {summary.skipped_done} already "
                   f"done{elsewhere}{busy}")
    typer.echo(f"warehouse: ingested {summary.ingested} run(s), {summary.unchanged} unchanged, "
               f"{len(summary.skipped)} skipped")
    for line in summary.skipped:
        typer.echo(f"skipped {line} (the bundle stays on disk; `matrun ingest` loads it once fixed)", err=True)
    for line in summary.unrunnable:
        typer.echo(f"not run, cannot run here (--skip-unrunnable): {line}", err=True)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # stop the running cell, record it as cancelled, keep the rest


@command(app)
def status(matrix: MatrixArg = Path("matrix.toml"), profile: ProfileOpt = None, sets: SetOpt = []) -> None:
    """Show, per cell of the matrix, how many repeats are done and how the last run ended."""
    overrides = parse_overrides(sets)
    rows, counts = status_rows(matrix_path=matrix, profile=profile, overrides=overrides)
    m = load_matrix(matrix, profile, overrides)
    progress = cell_progress(m.sweep.results / m.sweep.name)  # None: no Slurm submissions
    shown = f"{matrix} {spelled(overrides)}" if overrides else f"{matrix}"
    table = Table(title=f"{shown}: sweep {counts['sweep']}")
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


@command(app)
def cancel(
    matrix: MatrixArg = Path("matrix.toml"),
    profile: ProfileOpt = None,
    sets: SetOpt = [],
    wait: Annotated[float, typer.Option(help="Seconds to wait for the tasks to stop their containers.")] = 180.0,
) -> None:
    """Cancel the sweep's Slurm jobs (scancel); record and ingest the runs they stopped."""
    result = cancel_sweep(matrix_path=matrix, wait_s=wait, on_message=lambda text: typer.echo(text, err=True),
                          profile=profile, overrides=parse_overrides(sets))
    if not result["job_ids"]:
        typer.echo(f"sweep {result['sweep']}: no queued or running Slurm job; nothing to cancel")
        return
    typer.echo(f"sweep {result['sweep']}: cancelled Slurm job {', '.join(result['job_ids'])}; "
               f"{result['recorded']} run(s) recorded as cancelled; {result['left']} task(s) still ending")
    if not result["ended"] or result["left"]:
        raise typer.Exit(1)
