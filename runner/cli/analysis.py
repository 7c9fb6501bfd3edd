"""``matrun compare``, ``matrun advise``, ``matrun history`` and ``matrun explain``: reading
conclusions out of the warehouse.

Thin wrappers over ``warehouse/compare.py`` (the comparison, its CSV and JSON),
``warehouse/history.py`` (a workload across releases),
``reports/compare.py`` (its HTML page), ``warehouse/advise.py`` and ``warehouse/explain.py``
(docs/MODEL.md); docs/CLI.md.  The report
module is imported inside ``compare``, when ``--html`` asks for it: it loads Plotly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from matrun.errors import InputError
from matrun.runner.cli.common import TableFormatOpt, WarehouseOpt, app, check_format, command, out, resolve_warehouse
from matrun.warehouse import advise as adv
from matrun.warehouse import compare as cmp
from matrun.warehouse import explain as xpl
from matrun.warehouse import history as hist
from matrun.warehouse.compare import fmt_noisy, fmt_num, fmt_p, fmt_points, fmt_ratio, fmt_ratio_ci
from matrun.warehouse.query import json_value


@command(app)
def compare(
    a: Annotated[str, typer.Argument(metavar="A", help="Runs A, the reference: a sweep (NAME or sweep:NAME) or "
                                          "sql:SELECT run_id FROM run_overview WHERE ….")],
    b: Annotated[str, typer.Argument(metavar="B", help="Runs B, compared with A: the same forms.")],
    warehouse: WarehouseOpt = None,
    ignore: Annotated[list[str], typer.Option(
        "--ignore", metavar="KEY", help="A parameter left out of the match because A and B differ in it on purpose, "
        "e.g. onednn or variant (repeatable).")] = [],
    fmt: TableFormatOpt = "table",
    html: Annotated[Optional[Path], typer.Option(
        "--html", metavar="FILE", help="Also write the comparison as a self-contained HTML page to this file.")] = None,
) -> None:
    """Compare two sets of runs (two sweeps, or two SQL selections) cell by matched cell."""
    check_format(fmt, ("table", "csv", "json"))
    if html is not None and html.is_dir():
        raise InputError(f"--html {html}: is a directory; give a file name")
    result = cmp.compare(a, b, warehouse=resolve_warehouse(warehouse), ignore=ignore)
    if html is not None:
        from matrun.reports.compare import write_html  # Plotly and the report's templates: only for --html

        write_html(result, html)
    if fmt == "csv":
        sys.stdout.write(cmp.to_csv(result))
        typer.echo(result.summary(), err=True)
    elif fmt == "json":
        sys.stdout.write(_valid_json(cmp.to_json(result)))
    else:
        _compare_tables(result)
        typer.echo(result.summary())
    if html is not None:
        typer.echo(f"html: {html.resolve()}", err=True)


@command(app)
def history(
    warehouse: WarehouseOpt = None,
    metric: Annotated[str, typer.Option(
        "--metric", metavar="METRIC", help=f"One of {', '.join(hist.METRICS)}.")] = "throughput",
    by: Annotated[str, typer.Option(
        "--by", metavar="WHAT", help="release (the framework releases, in version order) or sweep (the sweeps in "
        "the order they ran: drift over dates).")] = "release",
    framework: Annotated[Optional[str], typer.Option(
        "--framework", metavar="NAME", help="Only this framework's workloads.")] = None,
    sweep: Annotated[Optional[str], typer.Option(
        "--sweep", metavar="NAME", help="Only the workloads this sweep ran (their runs from every sweep).")] = None,
    fmt: TableFormatOpt = "table",
) -> None:
    """A workload's metric across framework releases (or sweeps), each change tested against the one before."""
    check_format(fmt, ("table", "csv", "json"))
    result = hist.history(warehouse=resolve_warehouse(warehouse), metric=metric, by=by, framework=framework,
                          sweep=sweep)
    if fmt == "csv":
        sys.stdout.write(hist.to_csv(result))
        return
    if fmt == "json":
        sys.stdout.write(_valid_json(hist.to_json(result)))
        return
    if not result.points:
        typer.echo(f"no ok run with a {metric} and a framework release: no history")
        return
    unit = hist.METRICS[metric].unit
    for (_, _), points in result.workloads().items():
        table = Table(title=f"{points[0]['label']}: {metric}{f' ({unit})' if unit else ''} by {by}")
        for col in ("release" if by == "release" else "sweep", "runs", "median", "interval", "vs before",
                    "p (Holm)", "verdict"):
            table.add_column(col, overflow="fold")
        for p in points:
            table.add_row(p["point"], str(p["n"]), fmt_num(p["median"], 2),
                          f"{fmt_num(p['ci_low'], 2)}–{fmt_num(p['ci_high'], 2)}" if p["ci_low"] is not None else "-",
                          fmt_ratio_ci(p["ratio"], p["ratio_low"], p["ratio_high"], p["ratio_level"])
                          if p["prev_point"] is not None else "-",
                          fmt_p(p["p_adjusted"]) if p["prev_point"] is not None else "-", p["verdict"] or "-")
        out.print(table)
    for line in hist.sentences(result):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _valid_json(text: str) -> str:
    """The library's JSON document with NaN and ±Infinity, which JSON lacks and Python's json
    writes bare, as null (docs/CLI.md, "Exit codes and output for scripts")."""
    return json.dumps(json_value(json.loads(text)), indent=2, allow_nan=False) + "\n"


def _compare_tables(result: Any) -> None:
    typer.echo(f"A: {result.a.describe()} ({len(result.a.run_ids)} runs)")
    typer.echo(f"B: {result.b.describe()} ({len(result.b.run_ids)} runs)")
    if result.ignored:
        typer.echo(f"matched on every identity parameter except {', '.join(result.ignored)}")
    if result.matched:
        table = Table(title="matched cells (B against A)")
        for col in ("cell", "runs A/B", "train s A", "train s B", "time B/A", "img/s A", "img/s B",
                    "img/s B/A", "acc Δ pts", "p", "test", "verdict", "noisy"):
            table.add_column(col, overflow="fold", no_wrap=col in ("test", "verdict"))
        for c in result.matched:
            table.add_row(c["label"], f"{c['a_runs']}/{c['b_runs']}", fmt_num(c["a_train_s"], 2),
                          fmt_num(c["b_train_s"], 2), fmt_ratio(c["time_ratio"]),
                          fmt_num(c["a_throughput"]), fmt_num(c["b_throughput"]),
                          fmt_ratio_ci(c["throughput_ratio"], c["throughput_ratio_low"],
                                       c["throughput_ratio_high"], c["throughput_ratio_level"]),
                          fmt_points(c["accuracy_change"]),
                          fmt_p(c["p_value"]), c["test"] or "-", c["verdict"] or "not compared",
                          fmt_noisy(c))
        out.print(table)
        pooled = [c["label"] for c in result.matched if len(c["a_cells"]) > 1 or len(c["b_cells"]) > 1]
        if pooled:
            typer.echo(f"note: {len(pooled)} matched {'cell pools' if len(pooled) == 1 else 'cells pool'} "
                       f"the runs of several cells of one side ({', '.join(pooled)}): ignore fewer "
                       "parameters or narrow the selection to compare one cell with one")
        busy = [sum(c[f"{s}_busy_set_aside"] for c in result.matched) for s in ("a", "b")]
        if any(busy):
            typer.echo(f"note: busy runs set aside (they started on a busy machine and a clean run of the same "
                       f"repeat is compared instead): A {busy[0]}, B {busy[1]}")
        envs = sorted({(" ".join(c["a_envs"]), " ".join(c["b_envs"])) for c in result.matched})
        for env_a, env_b in envs:
            if env_a != env_b:
                typer.echo(f"environment: A {env_a} → B {env_b}")
    else:
        typer.echo("no cell of A matches a cell of B")
    for side, cells in (("A", result.only_a), ("B", result.only_b)):
        if cells:
            table = Table(title=f"only in {side} (not matched)")
            for col in ("cell", "cell ids", "ok runs", "img/s"):
                table.add_column(col, overflow="fold")
            s = side.lower()
            for c in cells:
                table.add_row(c["label"], " ".join(c[f"{s}_cells"]), str(c[f"{s}_runs"]),
                              fmt_num(c[f"{s}_throughput"]))
            out.print(table)


@command(app)
def explain(
    cell: Annotated[str, typer.Argument(metavar="CELL", help="A cell id, or its first 4 or more characters "
                                                              "(`matrun status` lists them).")],
    warehouse: WarehouseOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="text or json.")] = "text",
) -> None:
    """Where a cell's training step goes, what bounds it, how the other frameworks and the same
    framework's other cells (another layout, precision, …: named) do the same workload and, with
    more workers, the model's predicted speedup against the measured one."""
    check_format(fmt, ("text", "json"))
    result = xpl.explain(cell, warehouse=resolve_warehouse(warehouse))
    if fmt == "json":
        sys.stdout.write(_valid_json(xpl.to_json(result)))
        return
    for sentence in result["sentences"]:
        out.print(sentence, markup=False, highlight=False, soft_wrap=True)
        out.print()
    table = Table(title=f"phases of cell {result['cell']['cell_id'][:16]} (medians of the sampled steps)")
    for col in ("phase", "ms", "share", "samples"):
        table.add_column(col, overflow="fold")
    for p in result["phases"]:
        table.add_row(p["phase"], fmt_num(p["seconds_median"] * 1000, 3), f"{p['share'] * 100:.1f} %"
                      if p["share"] is not None else "-", str(p["samples"]))
    gap = result["cell"]["gap_s"]
    table.add_row("(in no phase)", fmt_num(gap * 1000 if gap is not None else None, 3),
                  f"{result['cell']['gap_share'] * 100:.1f} %" if result["cell"]["gap_share"] is not None else "-", "")
    out.print(table)


@command(app)
def advise(
    warehouse: WarehouseOpt = None,
    sweep: Annotated[Optional[str], typer.Option(
        "--sweep", metavar="NAME", help="Only the workloads (framework, model, dataset, device) this sweep ran.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="text, csv or json.")] = "text",
) -> None:
    """Per framework and workload: the best configuration found and its gain over the defaults."""
    check_format(fmt, ("text", "csv", "json"))
    rows = adv.advise(warehouse=resolve_warehouse(warehouse), sweep=sweep)
    if fmt == "csv":
        sys.stdout.write(adv.to_csv(rows))
        return
    if fmt == "json":
        sys.stdout.write(_valid_json(adv.to_json(rows)))
        return
    if not rows:
        typer.echo("no training cell with ok runs: nothing to advise")
        return
    for row in rows:
        out.print(row["advice"], markup=False, highlight=False, soft_wrap=True)
        out.print()
    table = Table(title="best configuration against the default settings (throughput: img/s, a language "
                        "model's sequences/s)")
    for col in ("framework", "workload", "default cell", "best cell", "changes", "runs D/B",
                "default", "best", "speedup", "acc Δ pts", "p", "test", "verdict"):
        table.add_column(col, overflow="fold")
    for r in rows:
        if r["default_cell_id"] is None:  # no default: show the fastest cell found, and no gain
            default = "ambiguous" if (r["default_note"] or "").startswith("ambiguous") else "none"
            best, changes = (f"{r['fastest_cell_id']} (fastest)" if r["fastest_cell_id"] else "-",
                             r["fastest_changes"])
            runs, best_thr = f"0/{r['fastest_runs'] or 0}", r["fastest_throughput"]
        else:
            default, best, changes = r["default_cell_id"], r["best_cell_id"] or "-", r["changes"]
            runs, best_thr = f"{r['default_runs'] or 0}/{r['best_runs'] or 0}", r["best_throughput"]
        table.add_row(adv.framework_name(r["framework"]), f"{r['model']} {r['dataset']} {r['device']}",
                      default, best, ", ".join(changes or []) or "-", runs,
                      fmt_num(r["default_throughput"]), fmt_num(best_thr),
                      fmt_ratio_ci(r["speedup"], r["speedup_low"], r["speedup_high"], r["speedup_level"]),
                      fmt_points(r["accuracy_change"]), fmt_p(r["p_value"]),
                      r["test"] or "-", r["verdict"] or "no default")
    out.print(table)
