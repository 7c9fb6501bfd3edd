"""The HTML of the study pages: tables of the study views with their figures.

Statistics are shown as the views compute them: a median with its interval (a 95 %
confidence interval, or below six runs only the [min, max] range, said so with its true
coverage), ``noisy`` where the coefficient of variation is above 5 %, and each comparison's
verdict as a badge: green or red only when the test found the difference significant; a
difference that is not significant is labelled "not significant", never "faster".
Every value from the warehouse passes through ``pages.esc`` (via ``table`` / ``tag``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import polars as pl

from matrun.reports.pages import Html, download_link, esc, join, table, tag
from matrun.reports.sections import flag, fmt, fmt_pct, is_missing, num
from matrun.reports.study_figures import interval_text

# An HTML table shows at most this many rows; the CSV next to it has them all.
MAX_TABLE_ROWS = 250


# --- cells of the tables ------------------------------------------------------------------


def ci_cell(row: Mapping[str, Any], stat: str, levels: Mapping[str, Mapping[str, Any]],
            *, digits: int = 2, percent: bool = False, median: str | None = None,
            noisy: bool = False) -> Html:
    """A median with its interval (and coverage) as the small line under it."""
    name = median or stat
    value = row.get(f"{name}_median")
    level = levels.get(row.get("cell_id"), {})
    text = fmt_pct(value, digits) if percent else fmt(value, digits)
    words = interval_text(row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high"),
                          level.get(f"{stat}_ci_level"), level.get(f"{stat}_n"), digits, percent)
    if is_missing(value):
        words = ""
    cell = num(text, words or None)
    if noisy and row.get(f"{name}_noisy"):
        cell = Html(cell + flag("noisy", "warn", "coefficient of variation above 5 %"))
    return cell


def verdict_badge(verdict: Any, significant: Any, p_value: Any = None, test: Any = None,
                  effect: str | None = None) -> Html:
    """A comparison's verdict: coloured only when significant, else "not significant"; under
    it the effect (``ratio_interval``), the p-value and the test."""
    if verdict is None:
        return esc(None)
    detail = [effect] if effect else []
    if not is_missing(p_value):
        detail.append(f"p = {p_value:.3g}")
    if test == "interval overlap":
        detail.append("too few runs to test")
    elif test:
        detail.append(str(test))
    sub = tag("span", " · ".join(detail), class_="sub",
              title="interval overlap: with these run counts no result can reach p < 0.05"
              if test == "interval overlap" else None) if detail else Html("")
    if verdict == "reference":
        return Html(flag("reference", "muted", "the cell the others are compared with") + sub)
    if verdict == "default is fastest":
        return Html(flag("default is fastest", "muted") + sub)
    if verdict == "within 5 %":
        return Html(flag("within 5 %", "muted", "the speedup's interval lies inside ±5 %: the defaults are as "
                         "fast as the best cell found") + sub)
    if significant is True and verdict in ("faster", "more accurate"):
        return Html(flag(verdict, "sig", "significant at p < 0.05") + sub)
    if significant is True and verdict in ("slower", "less accurate"):
        return Html(flag(verdict, "bad", "significant at p < 0.05") + sub)
    return Html(flag("not significant", "muted", "no significant difference at p < 0.05") + sub)


def ratio_interval(row: Mapping[str, Any], column: str) -> str | None:
    """A view's ratio column with its Hodges–Lehmann interval (the ``_low`` / ``_high`` /
    ``_level`` columns beside it): ``img/s ×1.39 (1.31–1.47)``, the level when below 95 %
    (``… (0.90–2.10 at 67 %)``); None without an interval (the reference row, one run each)."""
    value, low, high, level = (row.get(column), row.get(f"{column}_low"), row.get(f"{column}_high"),
                               row.get(f"{column}_level"))
    if is_missing(value) or is_missing(low) or is_missing(high):
        return None
    at = f" at {level * 100:.0f} %" if not is_missing(level) and level < 0.95 else ""
    return f"img/s ×{value:.2f} ({low:.2f}–{high:.2f}{at})"


def ratio(value: Any, digits: int = 2) -> Html:
    return num("–" if is_missing(value) else f"×{value:,.{digits}f}")


def change_pp(value: Any) -> Html:
    return num("–" if is_missing(value) else f"{value:+.2f} pp")


def onoff(value: Any) -> Any:
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) or value is None else value


# --- a table with its CSV ----------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Mapping[str, Any]], Any]


def table_block(title: str, table_id: str, frame: pl.DataFrame, columns: Sequence[Column],
                csv_href: str, *, row_class: Callable[[Mapping[str, Any]], str | None] | None = None,
                note: Any = None) -> Html:
    """A heading with the CSV link, then the table (at most MAX_TABLE_ROWS rows)."""
    rows = frame.head(MAX_TABLE_ROWS).to_dicts()
    head = tag("div", join([tag("h3", title), download_link(csv_href)]), class_="table-head")
    parts: list[Any] = [head]
    if note:
        parts.append(tag("p", note, class_="note"))
    parts.append(tag("div", table(
        [c.header for c in columns], [[c.cell(r) for c in columns] for r in rows],
        row_classes=[row_class(r) for r in rows] if row_class else None, id=table_id,
    ), class_="scroll"))
    if frame.height > MAX_TABLE_ROWS:
        parts.append(tag("p", f"Showing the first {MAX_TABLE_ROWS} of {frame.height} rows; "
                              "the CSV has them all.", class_="note"))
    return join(parts)


def _label(labels: Mapping[Any, str], key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda r: labels.get(r.get(key), r.get(key))


def _reference_row(r: Mapping[str, Any]) -> str | None:
    return "reference" if r.get("cell_id") is not None and r.get("cell_id") == r.get("ref_cell_id") else None


def _verdict(prefix: str = "", effect: str | None = None) -> Callable[[Mapping[str, Any]], Html]:
    """The verdict column of a view (``accuracy_`` for the accuracy test's), with the
    throughput ratio ``effect`` names and its interval (``ratio_interval``)."""
    return lambda r: verdict_badge(r.get(f"{prefix}verdict"), r.get(f"{prefix}significant"),
                                   r.get(f"{prefix}p_value"), r.get(f"{prefix}test"),
                                   ratio_interval(r, effect) if effect else None)


def more_note(shown: int, total: int, what: str) -> Html | str:
    return (f"The figures show the first {shown} of {total} {what}; the table and its CSV "
            "have them all." if total > shown else "")


# --- A1: default cells and best settings ---------------------------------------------------


def defaults_table(frame: pl.DataFrame, levels: Mapping[str, Mapping[str, Any]], *,
                   csv_href: str = "default_cells.csv") -> Html:
    columns = [
        Column("framework", lambda r: r["framework"]), Column("model", lambda r: r["model"]),
        Column("dataset", lambda r: r["dataset"]), Column("device", lambda r: r["device"]),
        Column("mode", lambda r: r["mode"]),
        Column("default cell", lambda r: tag("code", r["cell_id"]) if r["cell_id"] else
               flag(r["note"], "warn")),
        Column("preset", lambda r: r["preset"]), Column("threads", lambda r: r["threads"]),
        Column("batch", lambda r: r["batch_size"]), Column("epochs", lambda r: r["epochs"]),
        Column("optimizer · lr", lambda r: None if r["optimizer"] is None and r["lr"] is None
               else f"{r['optimizer']} · {r['lr']}"),
        Column("runs", lambda r: num(fmt(r["runs"]))),
        Column("train s", lambda r: ci_cell(r, "train_s", levels)),
        Column("test s", lambda r: num(fmt(r["test_s_median"], 2))),
        Column("accuracy", lambda r: ci_cell(r, "accuracy", levels, percent=True)),
        Column("images/s", lambda r: ci_cell(r, "throughput", levels, digits=1)),
    ]
    return table_block("Each framework at its default settings (A1, Tables VI–VII)",
                       "defaults-table", frame, columns, csv_href,
                       row_class=lambda r: None if r["cell_id"] else "muted")


def best_table(frame: pl.DataFrame, *,
               csv_href: str = "best_vs_default.csv") -> Html:
    columns = [
        Column("framework", lambda r: r["framework"]), Column("model", lambda r: r["model"]),
        Column("dataset", lambda r: r["dataset"]), Column("device", lambda r: r["device"]),
        Column("default", lambda r: tag("code", r["default_cell_id"]) if r["default_cell_id"]
               else flag(r["default_note"], "warn")),
        Column("best: what changes", lambda r: join(
            (tag("code", c) for c in (r["changes"] or [])), " ") if r["changes"]
            else ("the default itself" if r["best_cell_id"] else esc(None))),
        Column("candidates", lambda r: num(fmt(r["candidates"]))),
        Column("runs default / best", lambda r: num(f"{fmt(r['default_runs'])} / {fmt(r['best_runs'])}")),
        Column("images/s default → best", lambda r: num(
            f"{fmt(r['default_throughput'])} → {fmt(r['best_throughput'])}")),
        Column("speedup", lambda r: ratio(r["speedup"])),
        Column("train s default → best", lambda r: num(
            f"{fmt(r['default_train_s'], 2)} → {fmt(r['best_train_s'], 2)}")),
        Column("accuracy change", lambda r: change_pp(r["accuracy_change"])),
        Column("verdict", _verdict(effect="speedup")),
        # best_vs_default has no accuracy_significant: its verdict words a direction only
        # when the test found it significant.
        Column("accuracy", lambda r: verdict_badge(
            r["accuracy_verdict"], r["accuracy_verdict"] in ("more accurate", "less accurate"),
            r["accuracy_p_value"])),
    ]
    return table_block("Best settings against the defaults", "best-table", frame, columns,
                       csv_href,
                       note="The best cell is the fastest (median images/s) whose median accuracy "
                            "is at most 0.5 points below the default's. It counts as faster only "
                            "when the Mann–Whitney test says so (p < 0.05); with few runs it "
                            "cannot, and the verdict says 'not significant'.")


# --- A4-A5: libraries ----------------------------------------------------------------------


def library_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                  levels: Mapping[str, Mapping[str, Any]], *,
                  csv_href: str = "library_comparison.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("variant", lambda r: r["variant"]), Column("BLAS", lambda r: r["blas"]),
        Column("oneDNN", lambda r: onoff(r["onednn"])),
        Column("oneDNN primitives", lambda r: num(fmt(r["onednn_primitives"]))),
        Column("runs", lambda r: num(fmt(r["runs"]))),
        Column("train s", lambda r: ci_cell(r, "train_s", levels, noisy=True)),
        Column("test s", lambda r: num(fmt(r["test_s_median"], 2))),
        Column("accuracy", lambda r: num(fmt_pct(r["accuracy_median"], 2))),
        Column("images/s", lambda r: ci_cell(r, "throughput", levels, digits=1, noisy=True)),
        Column("CPU %", lambda r: num(fmt(r["cpu_total_median"], 0),
                                      f"usr {fmt(r['cpu_user_median'], 0)} · sys "
                                      f"{fmt(r['cpu_system_median'], 0)} · io {fmt(r['iowait_median'], 1)}")),
        Column("memory MiB avg / max", lambda r: num(f"{fmt(r['rss_avg_mb'])} / {fmt(r['rss_peak_mb'])}")),
        Column("speedup", lambda r: ratio(r["speedup"])),
        Column("accuracy change", lambda r: change_pp(r["accuracy_change"])),
        Column("verdict", _verdict(effect="throughput_ratio")),
    ]
    return table_block("Libraries per configuration (A4–A5, Tables IX–XI)", "libraries-table",
                       frame, columns, csv_href, row_class=_reference_row,
                       note="Compared with the framework's default library in the same "
                            "configuration (variant cpu with oneDNN on): speedup = its train s ÷ "
                            "this train s; the verdict tests the runs' throughput.")


# --- A6: threads ---------------------------------------------------------------------------


def thread_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                 levels: Mapping[str, Mapping[str, Any]], *,
                 csv_href: str = "thread_sweep.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("threads", lambda r: join([str(r["threads"]), " ", flag("fastest", "ok")])
               if r["fastest"] else str(r["threads"])),
        Column("interop", lambda r: r["interop_threads"]),
        Column("runs", lambda r: num(fmt(r["runs"]))),
        Column("train s", lambda r: ci_cell(r, "train_s", levels, noisy=True)),
        Column("images/s", lambda r: ci_cell(r, "throughput", levels, digits=1, noisy=True)),
        Column("accuracy", lambda r: num(fmt_pct(r["accuracy_median"], 2))),
        Column("CPU %", lambda r: num(fmt(r["cpu_total_median"], 0),
                                      f"usr {fmt(r['cpu_user_median'], 0)} · sys "
                                      f"{fmt(r['cpu_system_median'], 0)} · io {fmt(r['iowait_median'], 1)}")),
        Column("memory MiB max", lambda r: num(fmt(r["rss_peak_mb"]))),
        Column("speedup", lambda r: ratio(r["speedup"])),
        Column("verdict", _verdict(effect="throughput_ratio")),
    ]
    return table_block("Thread settings (A6, Table XII)", "threads-table", frame, columns,
                       csv_href, row_class=_reference_row,
                       note="Compared with the fewest threads given as a number. 'fastest' is the "
                            "highest median throughput of the configuration, tested or not.")


# --- A7: epochs ------------------------------------------------------------------------------


def epoch_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                levels: Mapping[str, Mapping[str, Any]], *,
                csv_href: str = "epoch_sweep.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("length", lambda r: f"{r['length']} {r['unit']}"),
        Column("runs", lambda r: num(fmt(r["runs"]), f"{r['diverged_runs']} diverged"
                                     if r["diverged_runs"] else None)),
        Column("train s", lambda r: ci_cell(r, "train_s", levels, noisy=True)),
        Column("s / epoch", lambda r: num(fmt(r["epoch_s_median"], 2))),
        Column("test s", lambda r: num(fmt(r["test_s_median"], 2))),
        Column("accuracy", lambda r: ci_cell(r, "accuracy", levels, percent=True)),
        Column("time ratio ÷ length ratio", lambda r: num(
            "–" if is_missing(r["time_linearity"]) else f"{r['time_linearity']:.2f}",
            None if is_missing(r["time_ratio"]) else
            f"×{r['time_ratio']:.2f} time for ×{r['length_ratio']:.2f} length")),
        Column("accuracy change", lambda r: change_pp(r["accuracy_change"])),
        Column("accuracy verdict", _verdict("accuracy_")),
    ]
    return table_block("Training length (A7, Tables XIII–XIV)", "epochs-table", frame, columns,
                       csv_href, row_class=_reference_row,
                       note="Time linearity 1.00 means the training time grew exactly in "
                            "proportion to the length, from the shortest length (the reference).")


# --- A8 / B2 / B3 and A11 / B1: batch --------------------------------------------------------


def batch_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                levels: Mapping[str, Mapping[str, Any]], *,
                csv_href: str = "batch_sweep.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("mode", lambda r: r["mode"]),
        Column("batch", lambda r: num(fmt(r["batch_size"]))),
        Column("runs", lambda r: num(fmt(r["runs"]), _not_ok(r))),
        Column("train s", lambda r: ci_cell(r, "train_s", levels, noisy=True)),
        Column("s / epoch", lambda r: num(fmt(r["epoch_s_median"], 2))),
        Column("inference s", lambda r: num(fmt(r["inference_s_median"], 2))),
        Column("images/s", lambda r: ci_cell(r, "throughput", levels, digits=1, noisy=True)),
        Column("accuracy", lambda r: ci_cell(r, "accuracy", levels, percent=True)),
        Column("speedup", lambda r: ratio(r["throughput_ratio"])),
        Column("verdict", _verdict(effect="throughput_ratio")),
        Column("accuracy verdict", lambda r: verdict_badge(
            r["accuracy_verdict"], r["accuracy_significant"], r["accuracy_p_value"])),
    ]
    return table_block("Batch size: speed, time and accuracy (A8, Tables XV–XVIII; B2–B3)",
                       "batch-table", frame, columns, csv_href,
                       row_class=lambda r: "oom" if not r["runs"] else _reference_row(r),
                       note="Compared with the smallest batch size; speedup here is the "
                            "throughput ratio.")


def _not_ok(r: Mapping[str, Any]) -> str | None:
    parts = [f"{r[k]} {w}" for k, w in (("oom_runs", "out of memory"), ("failed_runs", "failed"),
                                        ("timeout_runs", "timed out")) if r.get(k)]
    return ", ".join(parts) or None


def batch_resources_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                          csv_href: str = "batch_resources.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("mode", lambda r: r["mode"]),
        Column("batch", lambda r: num(fmt(r["batch_size"]))),
        Column("runs", lambda r: num(fmt(r["runs"]), _not_ok(r))),
        Column("CPU %", lambda r: num(fmt(r["cpu_total_median"], 0),
                                      f"usr {fmt(r['cpu_user_median'], 0)} · sys "
                                      f"{fmt(r['cpu_system_median'], 0)} · io {fmt(r['iowait_median'], 1)}")),
        Column("memory MiB avg / max", lambda r: num(f"{fmt(r['rss_avg_mb'])} / {fmt(r['rss_peak_mb'])}")),
        Column("device MiB max", lambda r: num(fmt(r["device_memory_peak_mb"]))),
        Column("memory limit MiB", lambda r: num(fmt(r["memory_limit_mb"], 0))),
        Column("images/s", lambda r: num(fmt(r["throughput_median"]))),
    ]
    return table_block("Resources against the batch size (A11, Table XXII; B1)", "batch-resources-table",
                       frame, columns, csv_href,
                       row_class=lambda r: "oom" if r["oom_runs"] and not r["runs"] else None,
                       note="Memory is MiB (2^20 bytes); iowait rising with the batch is the "
                            "sign of swapping.")


# --- A9-A10: batch x lr ----------------------------------------------------------------------


def lr_grid_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                  levels: Mapping[str, Mapping[str, Any]], *,
                  csv_href: str = "batch_lr_grid.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("batch", lambda r: num(fmt(r["batch_size"]))),
        Column("epochs", lambda r: num(fmt(r["epochs"]))),
        Column("iterations", lambda r: num(fmt(r["iterations"]))),
        Column("lr", lambda r: num("–" if r["lr"] is None else f"{r['lr']:g}")),
        Column("runs", lambda r: num(fmt(r["runs"]), f"{r['failed_runs']} failed" if r["failed_runs"] else None)),
        Column("accuracy", lambda r: join([
            ci_cell(r, "accuracy", levels, percent=True),
            flag("diverged (NaN)", "bad", f"{r['diverged_runs']} run(s) diverged") if r["diverged"] else "",
            flag("best", "ok") if r["best_accuracy"] else ""])),
        Column("train s", lambda r: num(fmt(r["train_s_median"], 2))),
        Column("s / epoch", lambda r: num(fmt(r["epoch_s_median"], 2))),
        Column("images/s", lambda r: num(fmt(r["throughput_median"]))),
    ]
    return table_block("Batch size × length × learning rate (A9–A10, Tables XIX–XXI)", "lr-grid-table",
                       frame, columns, csv_href,
                       row_class=lambda r: "failed" if r["diverged"] else None,
                       note="'best' is the highest median accuracy of the configuration among "
                            "cells without divergence (medians only, not a test).")


# --- scaling ----------------------------------------------------------------------------------


def scaling_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                  levels: Mapping[str, Mapping[str, Any]], *,
                  csv_href: str = "worker_scaling.csv") -> Html:
    columns = [
        Column("configuration", _label(labels, "config")),
        Column("workers", lambda r: num(fmt(r["workers"]))),
        Column("gpus · nodes", lambda r: f"{fmt(r['gpus'])} · {fmt(r['nodes'])}"),
        Column("global batch (per worker)", lambda r: num(fmt(r["global_batch"]), f"{fmt(r['per_worker_batch'])} per worker")),
        Column("exchange", lambda r: num(fmt_pct(r["exchange_fraction_median"], 0),
                                         None if is_missing(r["exchange_s_median"])
                                         else f"{1000 * r['exchange_s_median']:.1f} ms per step")),
        Column("runs", lambda r: num(fmt(r["runs"]), _not_ok(r))),
        Column("images/s", lambda r: ci_cell(r, "throughput", levels, digits=1, noisy=True)),
        Column("train s", lambda r: ci_cell(r, "train_s", levels)),
        Column("scaling", lambda r: r["scaling"]),
        Column("speedup", lambda r: ratio(r["speedup"])),
        Column("efficiency", lambda r: num(fmt_pct(r["efficiency"], 0))),
        Column("verdict", _verdict(effect="speedup")),
    ]
    return table_block("Scaling (A3, Table VIII; B4–B6; E Fig 10)", "scaling-table", frame, columns,
                       csv_href, row_class=_reference_row,
                       note="Speedup = throughput ÷ the 1-worker cell's (same per-worker batch: "
                            "weak scaling; same global batch: strong; the kind the cell declares); "
                            "efficiency = speedup ÷ workers, 100 % is linear; exchange = the "
                            "gradient exchange's share of a step, where the framework exposes it.")


# --- convergence -----------------------------------------------------------------------------


def convergence_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                      csv_href: str = "epoch_convergence.csv") -> Html:
    columns = [
        Column("cell", _label(labels, "cell_id")),
        Column("epoch", lambda r: num(fmt(r["epoch"] + 1))),
        Column("runs", lambda r: num(fmt(r["runs"]))),
        Column("test accuracy", lambda r: num(
            fmt_pct(r["test_accuracy_median"], 2),
            interval_text(r["test_accuracy_ci_low"], r["test_accuracy_ci_high"],
                          r["test_accuracy_ci_level"], r["runs"], 2, True))),
        Column("mean ± sd", lambda r: num(f"{fmt_pct(r['test_accuracy_mean'], 2)} ± "
                                          f"{fmt_pct(r['test_accuracy_sd'], 2)}")),
        Column("train accuracy", lambda r: num(fmt_pct(r["train_accuracy_mean"], 2))),
        Column("train loss", lambda r: num(fmt(r["train_loss_mean"], 3))),
        Column("s / epoch", lambda r: num(fmt(r["epoch_s_median"], 2), interval_text(
            r["epoch_s_ci_low"], r["epoch_s_ci_high"], None, r["runs"], 2)
            if not is_missing(r["epoch_s_ci_low"]) else None)),
        Column("elapsed s", lambda r: num(fmt(r["elapsed_s"], 1))),
    ]
    return table_block("Per cell and epoch (B7)", "convergence-table", frame, columns,
                       csv_href)


# --- layers ---------------------------------------------------------------------------------


def layer_kinds_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                      csv_href: str = "layer_kinds.csv") -> Html:
    columns = [
        Column("cell", lambda r: labels.get(r["cell_id"], r["cell_id"])),
        Column("kind", lambda r: r["kind"]), Column("layers", lambda r: num(fmt(r["layers"]))),
        Column("forward ms", lambda r: num(fmt(_ms(r["forward_s"]), 3))),
        Column("backward ms", lambda r: num(fmt(_ms(r["backward_s"]), 3))),
        Column("share", lambda r: num(fmt_pct(r["share"]))),
        Column("backward ÷ forward", lambda r: num(fmt(r["backward_ratio"], 2))),
        Column("params", lambda r: num(fmt(r["params"]))),
        Column("FLOPs / sample", lambda r: num(fmt(r["flops"]))),
    ]
    return table_block("Time by kind of layer (D Figs 6–7; E Fig 7)", "layer-kinds-table", frame,
                       columns, csv_href)


def layer_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                csv_href: str = "layer_breakdown.csv") -> Html:
    columns = [
        Column("cell", lambda r: labels.get(r["cell_id"], r["cell_id"])),
        Column("#", lambda r: num(fmt(r["layer_index"]))), Column("layer", lambda r: r["name"]),
        Column("kind", lambda r: r["kind"]), Column("runs", lambda r: num(fmt(r["runs"]))),
        Column("forward ms", lambda r: num(fmt(_ms(r["forward_s_median"]), 3))),
        Column("backward ms", lambda r: num(fmt(_ms(r["backward_s_median"]), 3))),
        Column("share", lambda r: num(fmt_pct(r["share"]))),
        Column("params", lambda r: num(fmt(r["params"]))),
        Column("FLOPs / sample", lambda r: num(fmt(r["flops"]))),
    ]
    return table_block("Every layer", "layers-table", frame, columns, csv_href)


def _ms(seconds: Any) -> Any:
    return None if is_missing(seconds) else seconds * 1000


# --- C: where a step's time goes ----------------------------------------------------------------


def _yes_no(value: Any) -> Any:
    return {True: "yes", False: "no"}.get(value, esc(None)) if isinstance(value, bool) or value is None else value


def iteration_cells(frame: pl.DataFrame) -> pl.DataFrame:
    """iteration_model (a row per cell and phase) as a row per cell: the per-cell columns, the
    cell's ``phases`` and ``phase_seconds`` in the order they run, and ``bottleneck_share``."""
    ordered = frame.sort(["cell_id", "ordinal"], maintain_order=True)
    phases = ordered.group_by("cell_id", maintain_order=True).agg(
        pl.col("phase").alias("phases"), pl.col("seconds_median").alias("phase_seconds"))
    share = frame.filter(pl.col("phase") == pl.col("bottleneck")).select(
        "cell_id", pl.col("share").alias("bottleneck_share")).unique(subset=["cell_id"], keep="first")
    cells = frame.unique(subset=["cell_id"], keep="first", maintain_order=True)
    return (cells.join(phases, on="cell_id", how="left", maintain_order="left")
            .join(share, on="cell_id", how="left", maintain_order="left"))


def _phase_list(r: Mapping[str, Any]) -> Html:
    return join((tag("span", f"{name} {fmt(_ms(seconds), 3)}",
                     class_="flag muted" if "+" in str(name) else None,
                     title="fused: one program, never split" if "+" in str(name) else None)
                 for name, seconds in zip(r["phases"] or [], r["phase_seconds"] or [])), " · ")


def iteration_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                    csv_href: str = "iteration_model.csv") -> Html:
    """A row per cell of iteration_model (its CSV: the view's rows, one per cell and phase)."""
    columns = [
        Column("cell", _label(labels, "cell_id")), Column("framework", lambda r: r["framework"]),
        Column("workers", lambda r: num(fmt(r["workers"]))),
        Column("step ms", lambda r: num(fmt(_ms(r["step_s_median"]), 3),
                                        f"sampled {fmt(_ms(r['sampled_step_s_median']), 3)}")),
        Column("phases (ms, in order)", _phase_list),
        Column("bottleneck", lambda r: r["bottleneck"]),
        Column("its share", lambda r: num(fmt_pct(r["bottleneck_share"]))),
        Column("fused", lambda r: _yes_no(r["fused"])),
        Column("in no phase", lambda r: num(fmt_pct(r["gap_share"]), f"{fmt(_ms(r['gap_s']), 4)} ms")),
        Column("sampling cost", lambda r: num("–" if is_missing(r["sampling_cost"])
                                              else f"{100 * r['sampling_cost']:+.1f}%")),
        Column("gradient bytes", lambda r: num(fmt(r["gradient_bytes"]))),
        Column("sampled steps", lambda r: num(fmt(r["sampled_steps"]), f"every {fmt(r['phase_every'])}th")),
    ]
    return table_block("Phases per cell (C)", "iterations-table", iteration_cells(frame), columns, csv_href,
                       note="Step ms: the median unsampled timed step (what the throughput is "
                            "computed from), under it the median sampled step; its share: the "
                            "bottleneck's median over the sampled step's; in no phase: the median "
                            "over the sampled steps of the step less its phases (can be a little "
                            "below zero); sampling cost: how much slower a sampled step is than "
                            "an unsampled one. The CSV has a row per cell and phase.")


def _speedup_error(value: Any) -> Html:
    return num("–" if is_missing(value) else f"{100 * value:+.1f}%")


def iteration_scaling_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                            csv_href: str = "iteration_scaling.csv") -> Html:
    def mb_per_s(value: Any) -> Html:
        return num("–" if is_missing(value) else f"{value / 1e6:,.1f}")

    columns = [
        Column("framework", lambda r: r["framework"]), Column("model", lambda r: r["model"]),
        Column("configuration", _label(labels, "config")),
        Column("workers", lambda r: num(fmt(r["workers"]), r["scaling"])),
        Column("pattern", lambda r: r["pattern"]), Column("transport", lambda r: r["transport"]),
        Column("latency ms", lambda r: num(fmt(_ms(r["latency_s"]), 3))),
        Column("bandwidth MB/s", lambda r: mb_per_s(r["bandwidth_bytes_per_s"])),
        Column("exchange ms", lambda r: num(fmt(_ms(r["exchange_s"]), 3),
                                            None if is_missing(r["gradient_bytes"])
                                            else f"{fmt(r['gradient_bytes'])} bytes")),
        Column("exposed ms", lambda r: num(fmt(_ms(r["exposed_s"]), 3),
                                           "overlaps backward" if r["overlaps_backward"] else None)),
        Column("predicted step ms", lambda r: num(fmt(_ms(r["predicted_step_s"]), 3))),
        Column("measured step ms", lambda r: num(fmt(_ms(r["measured_step_s"]), 3))),
        Column("predicted speedup", lambda r: ratio(r["predicted_speedup"])),
        Column("speedup", lambda r: ratio(r["speedup"])),
        Column("prediction error", lambda r: _speedup_error(r["prediction_error"])),
        Column("forward ÷ 1 worker", lambda r: ratio(r.get("forward_slowdown"))),
    ]
    return table_block("Predicted against measured scaling (C; B, E)", "iteration-scaling-table", frame,
                       columns, csv_href,
                       note="Exchange: latency + gradient bytes ÷ bandwidth, the least-squares fit of "
                            "the cell's own all-reduce calibration; exposed: the part not hidden "
                            "behind the reference's backward pass; predicted step: the reference's "
                            "compute plus the exposed exchange. Prediction error: predicted ÷ "
                            "measured speedup − 1. Forward ÷ 1 worker: the cell's forward phase "
                            "over the reference's; above ×1 the workers contend for the host, "
                            "which the model assumes they do not. MB = 10⁶ bytes.")


# --- options ---------------------------------------------------------------------------------


def option_table(frame: pl.DataFrame, labels: Mapping[Any, str], *,
                 csv_href: str = "option_effect.csv") -> Html:
    columns = [
        Column("option", lambda r: r["option"]),
        Column("default → value", lambda r: f"{r['ref_value']} → {r['value']}"),
        Column("configuration", _label(labels, "config")),
        Column("runs", lambda r: num(f"{fmt(r['runs'])} vs {fmt(r['ref_runs'])}")),
        Column("images/s", lambda r: num(f"{fmt(r['ref_throughput_median'])} → {fmt(r['throughput_median'])}")),
        Column("throughput ratio", lambda r: ratio(r["throughput_ratio"])),
        Column("train s", lambda r: num(f"{fmt(r['ref_train_s_median'], 2)} → {fmt(r['train_s_median'], 2)}")),
        Column("accuracy change", lambda r: change_pp(r["accuracy_change"])),
        Column("verdict", _verdict(effect="throughput_ratio")),
        Column("accuracy verdict", lambda r: verdict_badge(
            r["accuracy_verdict"], r["accuracy_significant"], r["accuracy_p_value"])),
    ]
    return table_block("Options, everything else equal (E; D Fig 3)", "options-table", frame,
                       columns, csv_href)


# --- Pareto ----------------------------------------------------------------------------------


def pareto_table(frame: pl.DataFrame, labels: Mapping[Any, str],
                 levels: Mapping[str, Mapping[str, Any]], *,
                 csv_href: str = "pareto_front.csv") -> Html:
    columns = [
        Column("model · dataset · device", lambda r: f"{r['model']} · {r['dataset']} · {r['device']}"),
        Column("cell", _label(labels, "cell_id")),
        Column("runs", lambda r: num(fmt(r["runs"]))),
        Column("train s", lambda r: ci_cell(r, "train_s", levels)),
        Column("accuracy", lambda r: ci_cell(r, "accuracy", levels, percent=True)),
        Column("front", lambda r: flag("on the front", "ok") if r["on_front"]
               else flag(f"dominated by {r['dominated_by']}", "muted")),
        Column("framework front", lambda r: "yes" if r["on_framework_front"] else "no"),
    ]
    return table_block("Training cells by time and accuracy", "pareto-table", frame, columns,
                       csv_href,
                       row_class=lambda r: "front" if r["on_front"] else None,
                       note="Dominance by medians only: cells whose intervals overlap may swap "
                            "places with more repeats.")
