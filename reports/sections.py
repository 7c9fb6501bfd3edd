"""The sections of the report page, each rendered from DataFrames into ``Html``.

Every value from the warehouse passes through ``pages.esc`` (directly or via ``table`` /
``tag``); numbers are formatted here, once, so the tables and the tests agree.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import polars as pl

from matrun.reports.pages import Html, download_link, esc, join, table, tag
from matrun.reports.shape import InForce, mismatch_list
from matrun.warehouse.bundles.layout import STATUSES
from matrun.warehouse.compare import fmt_p, fmt_ratio_ci
from matrun.warehouse.modes import NOISY_CV  # a throughput CV above it marks the cell noisy

_FAILED = frozenset(STATUSES) - {"ok"}  # every way a run can end but ok


# --- number formatting ------------------------------------------------------------------


def is_missing(value: Any) -> bool:
    """Whether a value from a DataFrame is missing: None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value: Any, digits: int = 1) -> str:
    """A number with thousands separators and ``digits`` decimals; a dash when missing."""
    if is_missing(value):
        return "–"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{float(value):,.{digits}f}"


def fmt_pct(value: Any, digits: int = 1) -> str:
    """A fraction as a percentage (0.853 -> 85.3%)."""
    return "–" if is_missing(value) else f"{100 * float(value):.{digits}f}%"


def num(text: str, sub: Any = None) -> Html:
    """A numeric table cell: ``text`` right-aligned, ``sub`` as a small second line."""
    extra = Html("") if sub is None else tag("span", sub, class_="sub")
    return Html(f'<span class="n">{esc(text)}</span>{extra}')


def flag(text: Any, kind: str = "warn", title: str | None = None) -> Html:
    return tag("span", text, class_=f"flag {kind}", title=title)


def status_flag(status: Any) -> Html:
    kind = "ok" if status == "ok" else "bad" if status in _FAILED else "muted"
    return flag(status, kind)


def section(anchor: str, title: str, lead: Any, *content: Any) -> Html:
    head = tag("h2", title) + (tag("p", lead, class_="lead") if lead else "")
    return tag("section", join([Html(head), *content]), id=anchor)


# --- summary cards ----------------------------------------------------------------------


def summary_cards(runs: pl.DataFrame, baseline: pl.DataFrame) -> Html:
    """Counts at a glance: cells, runs, ok / failed runs, runs with mismatches."""
    statuses = runs.get_column("status").to_list()
    failed = sum(1 for s in statuses if s != "ok")
    mismatched = sum(1 for m in runs.get_column("mismatches").to_list() if mismatch_list(m))
    cells = runs.select(["sweep", "cell_id"]).unique().height
    cards = [
        ("cells", cells, ""), ("runs", len(statuses), ""),
        ("ok runs", len(statuses) - failed, ""),
        ("not ok", failed, "bad" if failed else ""),
        ("runs with mismatches", mismatched, "warn" if mismatched else ""),
        ("cells with results", baseline.height, ""),
    ]
    return tag("div", join(
        tag("div", join([tag("div", fmt(v), class_="v"), tag("div", k, class_="k")]),
            class_=f"card {kind}".strip())
        for k, v, kind in cards
    ), class_="cards")


# --- baseline table ---------------------------------------------------------------------


def baseline_section(
    baseline: pl.DataFrame,
    params: Sequence[str],
    cell_params: Mapping[tuple[str, str], Mapping[str, Any]],
    unfinished: Sequence[tuple[str, str]],
    figure: Html,
    *,
    csv_href: str | None = None,
) -> Html:
    """Per cell: medians over its ok runs with min–max spread, then the throughput bars.

    ``params`` are the parameter columns shown (those that vary); ``cell_params`` gives
    their values by (sweep, cell_id); ``unfinished`` lists (label, statuses) of cells that
    have runs but no successful one.
    """
    energy = "j_per_image_median" in baseline.columns and \
        baseline.get_column("j_per_image_median").drop_nulls().len() > 0
    # a language model's columns, where the table has one (docs/TRANSFORMERS.md)
    text = "tokens_per_second_median" in baseline.columns and \
        baseline.get_column("tokens_per_second_median").drop_nulls().len() > 0
    headers = [*params, "runs", "train s", "test s", "accuracy",
               "throughput (images or sequences/s)" if text else "throughput (images/s)",
               *(["tokens/s", "perplexity"] if text else []),
               "CPU %", "memory MiB avg / peak", *(["energy J / image"] if energy else []), "flags"]
    rows: list[list[Any]] = []
    classes: list[str | None] = []
    for row in baseline.iter_rows(named=True):
        values = cell_params.get((row["sweep"], row["cell_id"]), row)
        flags: list[Html] = []
        cv = row.get("throughput_cv")
        if not is_missing(cv) and cv > NOISY_CV:
            flags.append(flag("noisy", "warn", f"throughput CV {fmt_pct(cv)} > {fmt_pct(NOISY_CV, 0)}"))
        mismatch_runs = row.get("mismatch_runs") or 0
        if mismatch_runs:
            flags.append(flag(f"⚠ mismatch in {mismatch_runs} run(s)", "warn",
                              "what was asked differs from what was in force; see Provenance"))
        throttled_runs = row.get("throttled_runs") or 0
        if throttled_runs:
            flags.append(flag(f"⚠ GPU throttled in {throttled_runs} run(s)", "warn",
                              "NVML saw a power-cap, thermal or hardware slowdown: see gpu_samples"))
        busy_runs = row.get("busy_runs") or 0
        if busy_runs:
            flags.append(flag(f"⚠ busy machine in {busy_runs} run(s)", "warn",
                              "other processes used the cell's CPUs as it started: see run_overview.busy_reasons"))
        if row.get("bimodal"):
            flags.append(flag("bimodal", "warn",
                              f"the runs fall into two modes: {fmt(row.get('slow_runs'))} at "
                              f"{fmt(row.get('slow_throughput_median'), 1)} and {fmt(row.get('fast_runs'))} at "
                              f"{fmt(row.get('fast_throughput_median'), 1)} images/s (over every sweep); "
                              "the median describes neither: see view cell_modes"))
        drifted_runs = row.get("drifted_runs") or 0
        if drifted_runs:
            flags.append(flag(f"⚠ drift in {drifted_runs} run(s)", "warn",
                              "measured while the sweep's canary had drifted beyond its spread: "
                              "see views canary_drift and run_drift"))
        if row.get("runs", 0) < 3:
            flags.append(flag("< 3 runs", "muted", "medians over fewer than three repeats"))
        rows.append([
            *[_param(values.get(p)) for p in params],
            num(fmt(row["runs"])),
            num(fmt(row["train_s_median"], 2),
                f"{fmt(row['train_s_min'], 2)}–{fmt(row['train_s_max'], 2)}"),
            num(fmt(row["test_s_median"], 2)),
            num(fmt_pct(row["accuracy_median"], 2),
                f"{fmt_pct(row['accuracy_min'], 2)}–{fmt_pct(row['accuracy_max'], 2)}"),
            num(fmt(row["throughput_median"], 1),
                f"{fmt(row['throughput_min'], 1)}–{fmt(row['throughput_max'], 1)} · CV {fmt_pct(cv)}"),
            *([num(fmt(row.get("tokens_per_second_median"), 0)),
               num(fmt(row.get("perplexity_median"), 3),
                   None if is_missing(row.get("perplexity_median"))
                   else f"{fmt(row.get('perplexity_min'), 3)}–{fmt(row.get('perplexity_max'), 3)}")]
              if text else []),
            num(fmt(row["cpu_total_median"], 0),
                f"usr {fmt(row['cpu_user_median'], 0)} · sys {fmt(row['cpu_system_median'], 0)}"
                f" · io {fmt(row['iowait_median'], 1)}"),
            num(f"{fmt(row['rss_avg_mb'], 1)} / {fmt(row['rss_peak_mb'], 1)}"),
            *([num(fmt(row.get("j_per_image_median"), 4))] if energy else []),
            join(flags, " "),
        ])
        classes.append("mismatch" if mismatch_runs or throttled_runs or busy_runs else None)
    parts: list[Any] = [download_link(csv_href)] if csv_href and rows else []
    if rows:
        parts.append(tag("div", table(headers, rows, row_classes=classes, id="baseline-table"),
                         class_="scroll"))
    else:
        parts.append(tag("p", "No cell has a successful run yet.", class_="banner warn"))
    if unfinished:
        items = join(tag("li", join([tag("b", label), " — ", statuses])) for label, statuses in unfinished)
        parts.append(tag("p", f"{len(unfinished)} cell(s) have runs but none succeeded "
                              "(see Runs for their errors):", class_="note"))
        parts.append(tag("ul", items))
    parts.append(figure)
    return section(
        "baseline", "Baseline",
        "Medians over each cell's successful repeats; the small line under a number is its "
        "min–max spread. " + ("A language model's accuracy is next-token accuracy, its throughput "
        "sequences/s, with tokens/s and perplexity (exp of the test loss) beside them. " if text else "") + "CPU % is percent of one core summed over the cell's processes "
        "(200 = two cores busy); memory is the resident set in MiB: the median of the runs' averages, and the highest peak of any run. "
        "Cells with fewer than three runs or a throughput CV over 5% are flagged.",
        *parts,
    )


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


# --- epochs and monitor -----------------------------------------------------------------


def epochs_section(figure: Html, *, csv_href: str | None = None) -> Html:
    return section(
        "epochs", "Accuracy and time per epoch",
        "Test accuracy after each epoch (bars: min–max over repeats) and the seconds each "
        "epoch's training took, per cell.",
        download_link(csv_href) if csv_href else "", figure,
    )


def monitor_section(figure: Html, selected: str | None, embedded: int, total: int) -> Html:
    """The time-series figure and which runs it can show."""
    if selected is None:
        return section("monitor", "CPU and memory over time", "No runs yet.")
    note = (
        f"Showing run {selected}. The menu switches between the {embedded} runs embedded in "
        f"this page (this one and the most recent others, of {total} runs); for any other run, "
        "rebuild the report with its "
        "run id (matrun report --run RUN_ID). Series longer than 500 samples are "
        "averaged into 500 buckets (memory keeps each bucket's peak)."
        if embedded > 1 else
        f"Showing run {selected}; rebuild with another run id "
        "(matrun report --run RUN_ID) to show another run."
    )
    return section("monitor", "CPU and memory over time", note, figure)


# --- provenance -------------------------------------------------------------------------


def provenance_section(hosts: pl.DataFrame, envs: pl.DataFrame, in_force: Sequence[InForce],
                       images: pl.DataFrame | None = None, *, downloads: bool = False) -> Html:
    """Where the runs ran, with what, and what was really in force, mismatches flagged.

    ``images``: the images table (tag, versions, BLAS, oneDNN, CUDA), shown when it has
    rows.  ``downloads`` adds a CSV link to each table (the files are written by the site).
    """
    def heading(text: str, csv: str) -> Html:
        if not downloads:
            return tag("h3", text)
        return tag("div", join([tag("h3", text), download_link(csv)]), class_="table-head")

    parts: list[Any] = []
    if hosts.height > 1:
        parts.append(tag("p", f"⚠ These runs come from {hosts.height} different host setups: "
                              "compare times across them with care.", class_="banner warn"))
    mismatched = [g for g in in_force if g.mismatches]
    if mismatched:
        parts.append(tag("p", f"⚠ {sum(g.runs for g in mismatched)} run(s) in "
                              f"{len({(g.sweep, g.cell_id) for g in mismatched})} cell(s) did not get "
                              "what they asked for; the rows are highlighted below.",
                         class_="banner warn"))
    if downloads:
        parts.append(tag("p", join(["Every run's host, versions, image and what was in force, "
                                    "one row per run: ",
                                    download_link("provenance.csv", "provenance.csv")]),
                         class_="note"))
    parts.append(heading("Hosts", "hosts.csv"))
    parts.append(_frame_table(hosts, {
        "hostname": "host", "cpu_model": "CPU model", "cpu_count": "CPUs", "os": "OS",
        "python": "Python", "matrun_version": "matrun", "runs": "runs"}))
    parts.append(heading("Frameworks and environments", "environments.csv"))
    parts.append(_frame_table(envs, {
        "framework": "framework", "framework_version": "version", "env_id": "environment",
        "executor": "executor", "image_tag": "image", "image_blas": "image BLAS",
        "image_onednn": "image oneDNN", "build": "build", "runs": "runs"}))
    if images is not None and not images.is_empty():
        parts.append(heading("Images", "images.csv"))
        parts.append(_images_table(images))
    parts.append(heading("What was in force", "in_force.csv"))
    rows = []
    for g in in_force:
        f = g.in_force
        rows.append([
            g.label, num(fmt(g.runs)),
            _asked_vs(g.asked_threads, f.get("threads")),
            esc(f.get("interop_threads")),
            esc(_affinity(f.get("affinity"))),
            _asked_vs(g.asked_onednn, f.get("onednn")),
            esc(f.get("device")),
            _libraries(g.libraries),
            join((flag(f"⚠ {m}", "warn") for m in g.mismatches), " ") if g.mismatches
            else flag("none", "ok"),
        ])
    parts.append(tag("div", table(
        ["cell", "runs", "threads asked → in force", "interop threads", "affinity",
         "oneDNN asked → in force", "device", "libraries loaded", "mismatches"],
        rows, row_classes=["mismatch" if g.mismatches else None for g in in_force],
        id="in-force-table"), class_="scroll"))
    return section(
        "provenance", "Provenance",
        "Hosts, versions and what the harness found in force in each cell (threads, CPU "
        "affinity, oneDNN, the BLAS / OpenMP libraries actually loaded).",
        *parts,
    )


def _images_table(images: pl.DataFrame) -> Html:
    rows = []
    for r in images.iter_rows(named=True):
        size = r.get("size_bytes")
        rows.append([
            tag("code", r["tag"]), r.get("framework"), r.get("variant"), r.get("framework_version"),
            r.get("python"), r.get("blas"), r.get("onednn"), r.get("openmp"), r.get("cuda"),
            r.get("cudnn"), num(fmt(None if size is None else size / 2**20, 0)),
            esc(_when(r.get("recorded_at"))),
            num(fmt(r.get("runs"))) if r.get("runs") else flag("no run here", "muted"),
        ])
    return tag("div", table(
        ["tag", "framework", "variant", "version", "Python", "BLAS", "oneDNN", "OpenMP", "CUDA",
         "cuDNN", "MiB", "recorded", "runs"], rows, id="images-table"), class_="scroll")


def _frame_table(frame: pl.DataFrame, columns: Mapping[str, str]) -> Html:
    present = [c for c in columns if c in frame.columns
               and (not c.startswith("image_") or frame.get_column(c).drop_nulls().len() > 0)]
    rows = [[num(fmt(r[c])) if c in ("runs", "cpu_count") else r[c] for c in present]
            for r in frame.iter_rows(named=True)]
    return tag("div", table([columns[c] for c in present], rows), class_="scroll")


def _asked_vs(asked: Any, in_force: Any) -> Html:
    shown = _param(in_force)
    asked_shown = {"True": "on", "False": "off"}.get(str(asked), asked)
    return join([asked_shown, " → ", "–" if shown is None else shown])


def _affinity(cpus: Any) -> str | None:
    if isinstance(cpus, list):
        return ",".join(str(c) for c in cpus) if cpus else "none"
    return None if cpus is None else str(cpus)


def _libraries(libraries: Sequence[Mapping[str, Any]]) -> Html:
    if not libraries:
        return esc(None)
    items = []
    for lib in libraries:
        extra = [f"v{lib['version']}" if lib.get("version") else "",
                 f"{lib['threads']} threads" if lib.get("threads") is not None else ""]
        detail = ", ".join(e for e in extra if e)
        items.append(tag("li", join([
            tag("b", lib.get("name", "?")), f" ({detail})" if detail else "",
            tag("span", lib.get("path", ""), class_="sub"),
        ])))
    return tag("ul", join(items), class_="libs")


# --- runs -------------------------------------------------------------------------------


def runs_section(
    runs: pl.DataFrame, labels: Mapping[tuple[str, str], str], selected: str | None,
    *, csv_href: str | None = None,
) -> Html:
    """Every run with its status, newest first; a run that did not succeed shows its error tail."""
    rows = []
    classes: list[str | None] = []
    tails: list[Html | None] = []
    for r in runs.sort(["started_at", "run_id"], descending=True, nulls_last=True).iter_rows(named=True):
        mismatches = mismatch_list(r.get("mismatches"))
        tail = r.get("error_tail") or ""
        rows.append([
            join([tag("code", r["run_id"]), " ",
                  flag("shown above", "ok") if r["run_id"] == selected else ""]),
            labels.get((r["sweep"], r["cell_id"]), r["cell_id"]),
            status_flag(r["status"]),
            num(fmt(r.get("exit_code"))),
            esc(_when(r.get("started_at"))),
            num(fmt(r.get("wall_seconds"), 1)),
            num(fmt(r.get("throughput"), 1)),
            num(fmt_pct(r.get("accuracy"), 2)),
            join((flag(f"⚠ {m}", "warn") for m in mismatches), " ") if mismatches else esc(None),
        ])
        row_class = r["status"] if r["status"] in _FAILED else "mismatch" if mismatches else None
        if r["run_id"] == selected:
            row_class = f"{row_class or ''} selected".strip()
        classes.append(row_class)
        tails.append(tag("details", join([
            tag("summary", f"error tail of {r['run_id']} (last lines of its standard error)"),
            tag("pre", tail, class_="tail"),
        ]), open=r["status"] in _FAILED) if tail else None)
    return section(
        "runs", "Runs",
        "Every run in the report, newest first. A run that did not succeed shows the last "
        "lines of its standard error. The run id is what matrun report --run takes.",
        download_link(csv_href) if csv_href else "",
        tag("div", table(["run id", "cell", "status", "exit", "started", "wall s",
                          "images/s", "accuracy", "mismatches"],
                         rows, row_classes=classes, after=tails, id="runs-table"),
            class_="scroll"),
    )


def _when(value: Any) -> str | None:
    if value is None:
        return None
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


# --- the page without data ----------------------------------------------------------------


def empty_section(sweep: str | None) -> Html:
    what = f"in sweep {sweep!r}" if sweep else "in the warehouse"
    return tag("section", join([
        tag("h2", f"No runs yet {what}."),
        tag("p", "Run a sweep (matrun sweep) or load result bundles (matrun ingest DIR), "
                 "then build this report again.", class_="lead"),
    ]), class_="empty", id="empty")


def releases_table(points: Sequence[Mapping[str, Any]], *, csv_href: str | None = None) -> Html:
    """``matrun history``'s points: per workload and release the runs, median, interval, the
    change against the release before, Holm's adjusted p and the verdict."""
    headers = ["framework", "workload", "release", "runs", "median", "interval", "vs before", "p (Holm)",
               "verdict"]
    rows = []
    for p in points:
        first = p["prev_point"] is None
        rows.append([
            p["framework"], p["label"], p["point"], num(fmt(p["n"])), num(fmt(p["median"], 2)),
            num(f"{fmt(p['ci_low'], 2)}–{fmt(p['ci_high'], 2)}") if not is_missing(p["ci_low"]) else num("–"),
            "–" if first else fmt_ratio_ci(p["ratio"], p["ratio_low"], p["ratio_high"], p["ratio_level"]),
            "–" if first or p["p_adjusted"] is None else num(fmt_p(p["p_adjusted"])),
            "first" if first else (p["verdict"] or "–"),
        ])
    parts: list[Any] = [download_link(csv_href)] if csv_href and rows else []
    parts.append(tag("div", table(headers, rows, id="releases-table"), class_="scroll"))
    return join(parts)
