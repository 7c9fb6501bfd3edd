"""``matrun advise``: per framework and workload, the best configuration found and its gain
over the framework's default settings, with the evidence, in plain sentences.

The numbers are the ``best_vs_default`` view's (docs/WAREHOUSE.md: default cell, candidates,
Mann–Whitney test of the best cell's throughput against the default's), with the intervals
and noise flags of ``cell_stats``.  This module only words them, and says so honestly when
there is no default to compare against or when a gain is not significant.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from matrun.frameworks import display_name
from matrun.warehouse.compare import (
    check_sweep, check_warehouse, fetch, fmt_num, fmt_p, fmt_points, fmt_ratio_ci, reader,
)

# best_vs_default with the evidence cell_stats adds; `fastest`: the group's fastest
# training cell whatever the default (what there is to say without one); `gaps`: per cell
# the default settings it lacks, by the rule of views/default_cells.sql step 1, so that a
# missing default comes with the parameters to run; `closest`: the cell lacking the fewest.
ADVISE_SQL = """
WITH v AS (
    SELECT v.* FROM best_vs_default AS v
    WHERE $sweep IS NULL OR EXISTS (
        SELECT 1 FROM cell_stats AS c
        WHERE list_contains(c.sweeps, $sweep) AND c.mode = 'train' AND c.framework = v.framework
          AND c.model = v.model AND c.dataset = v.dataset AND c.device = v.device)
),
fastest AS (
    SELECT framework, model, dataset, device,
        first(cell_id ORDER BY coalesce(tokens_per_second_median, throughput_median) DESC,
              train_s_median ASC NULLS LAST, cell_id) AS fastest_cell_id
    FROM cell_stats
    WHERE mode = 'train' AND runs > 0 AND diverged_runs = 0 AND throughput_median IS NOT NULL
    GROUP BY ALL
),
gaps AS (
    SELECT framework, model, dataset, device, cell_id, throughput_median,
        list_transform(list_filter([
            struct_pack(ok := threads = 'unset', want := 'threads = "unset"'),
            struct_pack(ok := interop_threads = 'unset', want := 'interop_threads = "unset"'),
            struct_pack(ok := onednn, want := 'onednn = true'),
            struct_pack(ok := layout = framework_default_layout(framework)
                              OR (layout IS NULL AND transformer_model(model)),
                        want := 'layout = "' || framework_default_layout(framework) || '"'),
            struct_pack(ok := coalesce(params ->> 'compile', 'default') = 'default',
                        want := 'compile = "default"'),
            struct_pack(ok := coalesce(params ->> 'attention', 'default') = 'default',
                        want := 'attention = "default"'),
            struct_pack(ok := precision = 'fp32', want := 'precision = "fp32"'),
            struct_pack(ok := conv_algo = framework_default_conv_algo(framework, device),
                        want := 'conv_algo = "' || framework_default_conv_algo(framework, device) || '"'),
            struct_pack(ok := device <> 'cpu' OR variant = 'cpu', want := 'variant = "cpu"'),
            struct_pack(ok := workers = 1, want := 'one worker (gpus = 1)'),
            struct_pack(ok := coalesce(cpuset, '') = '', want := 'cpuset = ""'),
            struct_pack(ok := coalesce(TRY_CAST(params ->> 'memory_limit' AS BIGINT), 0) = 0,
                        want := 'memory_limit = 0'),
            struct_pack(ok := NOT coalesce(TRY_CAST(params ->> 'layer_profile' AS BOOLEAN), false),
                        want := 'layer_profile = false'),
            struct_pack(ok := preset IN ('framework-default', 'none'), want := 'preset = "framework-default"')],
            lambda c: NOT coalesce(c.ok, false)), lambda c: c.want) AS missing
    FROM cell_stats
    WHERE mode = 'train' AND runs > 0
),
closest AS (
    SELECT framework, model, dataset, device,
        first(cell_id ORDER BY len(missing), throughput_median DESC NULLS LAST, cell_id) AS closest_cell_id,
        first(missing ORDER BY len(missing), throughput_median DESC NULLS LAST, cell_id) AS missing_default
    FROM gaps
    GROUP BY ALL
)
SELECT v.*,
    dc.throughput_ci_low AS default_throughput_ci_low, dc.throughput_ci_high AS default_throughput_ci_high,
    dc.throughput_ci_level AS default_throughput_ci_level,
    dc.throughput_cv AS default_throughput_cv, dc.throughput_noisy AS default_noisy,
    bc.throughput_ci_low AS best_throughput_ci_low, bc.throughput_ci_high AS best_throughput_ci_high,
    bc.throughput_ci_level AS best_throughput_ci_level,
    bc.throughput_cv AS best_throughput_cv, bc.throughput_noisy AS best_noisy,
    f.fastest_cell_id, fc.runs AS fastest_runs, fc.throughput_median AS fastest_throughput,
    fc.train_s_median AS fastest_train_s, fc.accuracy_median AS fastest_accuracy,
    cl.closest_cell_id, cl.missing_default, dc.seq_len AS seq_len, fc.seq_len AS fastest_seq_len,
    (SELECT min(k) FROM range(1, 64) AS t(k) WHERE mw_can_decide(k, k)) AS min_repeats
FROM v
LEFT JOIN cell_stats AS dc ON dc.cell_id = v.default_cell_id
LEFT JOIN cell_stats AS bc ON bc.cell_id = v.best_cell_id
LEFT JOIN fastest AS f
       ON f.framework = v.framework AND f.model = v.model AND f.dataset = v.dataset AND f.device = v.device
LEFT JOIN cell_stats AS fc ON fc.cell_id = f.fastest_cell_id
LEFT JOIN closest AS cl
       ON cl.framework = v.framework AND cl.model = v.model AND cl.dataset = v.dataset AND cl.device = v.device
ORDER BY v.framework, v.model, v.dataset, v.device
"""

#: The columns of one piece of advice, in the order CSV gives them.
COLUMNS = (
    "framework", "model", "dataset", "device", "advice",
    "default_cell_id", "default_note", "candidates", "best_cell_id", "changes",
    "default_runs", "best_runs",
    "default_throughput", "default_throughput_ci_low", "default_throughput_ci_high",
    "default_throughput_ci_level", "default_throughput_cv", "default_noisy",
    "best_throughput", "best_throughput_ci_low", "best_throughput_ci_high",
    "best_throughput_ci_level", "best_throughput_cv", "best_noisy",
    "speedup", "speedup_low", "speedup_high", "speedup_level", "default_train_s", "best_train_s", "time_speedup",
    "default_accuracy", "best_accuracy", "accuracy_change",
    "p_value", "test", "significant", "verdict", "accuracy_p_value", "accuracy_verdict",
    "fastest_cell_id", "fastest_changes", "fastest_runs", "fastest_throughput",
    "fastest_train_s", "fastest_accuracy", "closest_cell_id", "missing_default", "min_repeats",
    "seq_len", "fastest_seq_len",
)


def advise(*, warehouse: Path | str, sweep: str | None = None) -> list[dict[str, Any]]:
    """One row per (framework, model, dataset, device) with training cells; ``advice`` words it.

    ``sweep`` keeps the workloads that sweep ran (their cells are compared over every sweep
    that ran them, as in the views).  Raises :class:`InputError` for a missing warehouse or
    an unknown sweep.  Reads only.
    """
    path = check_warehouse(warehouse)
    with reader(path) as con:
        if sweep is not None:
            check_sweep(con, sweep, path)
        rows = fetch(con, ADVISE_SQL, {"sweep": sweep})
        varying = _varying_params(con)
    for row in rows:
        group = (row["framework"], row["model"], row["dataset"], row["device"])
        row["fastest_changes"] = _shown(varying.get(group, {}).get(row["fastest_cell_id"]))
        row["advice"] = sentence(row)
    return [{k: row.get(k) for k in COLUMNS} for row in rows]


def _varying_params(con: Any) -> dict[tuple, dict[str, dict[str, Any]]]:
    """Per workload, each training cell's parameters that differ between the workload's cells."""
    cells = fetch(con, "SELECT framework, model, dataset, device, cell_id, params FROM cell_stats "
                       "WHERE mode = 'train' AND runs > 0")
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["framework"], c["model"], c["dataset"], c["device"]), {})[c["cell_id"]] = \
            {k: v for k, v in json.loads(c["params"]).items() if v is not None}
    out: dict[tuple, dict[str, dict[str, Any]]] = {}
    for group, by_cell in groups.items():
        keys = sorted({k for p in by_cell.values() for k in p})
        vary = [k for k in keys if len({json.dumps(p.get(k)) for p in by_cell.values()}) > 1]
        out[group] = {cell: {k: p.get(k) for k in vary} for cell, p in by_cell.items()}
    return out


def _shown(params: dict[str, Any] | None) -> list[str] | None:
    if params is None:
        return None
    return [f"{k}={json.dumps(v)}" for k, v in params.items()]


def framework_name(framework: str) -> str:
    """How the sentences name a framework: its ``display_name`` (framework.toml); any other
    is named as in the warehouse."""
    return display_name(framework)


def _n_runs(n: int | None) -> str:
    return "1 run" if n == 1 else f"{n} runs"


def _runs(m: int | None, n: int | None) -> str:
    return f"{m} repeats per side" if m == n else f"{m} against {n} repeats"


def _interval(low: float | None, high: float | None, level: float | None) -> str:
    if low is None or high is None:
        return "no interval with one run"
    if level is not None and level < 0.95:
        return f"range {fmt_num(low)}–{fmt_num(high)}, only {level:.0%} coverage"
    return f"95 % CI {fmt_num(low)}–{fmt_num(high)}"


def _side_interval(row: dict[str, Any], side: str) -> str:
    """The side's throughput interval, in tokens/s for a language model (× its seq_len)."""
    scale = row["seq_len"] or 1
    low, high = row[f"{side}_throughput_ci_low"], row[f"{side}_throughput_ci_high"]
    return _interval(None if low is None else low * scale, None if high is None else high * scale,
                     row[f"{side}_throughput_ci_level"])


def sentence(row: dict[str, Any]) -> str:
    """The advice for one workload in plain words (numbers rounded for reading)."""
    fw = framework_name(row["framework"])
    where = f"{fw}, {row['model']} on {row['dataset']} ({row['device']})"
    if row["default_cell_id"] is None:
        return f"{where}: {_no_default(row, fw)}{_fastest(row)}"
    if row["best_cell_id"] is None:
        return (f"{where}: the default cell {row['default_cell_id']} has no candidate to compare with "
                "(no cell with ok runs, no divergence, a throughput and the default's accuracy).")
    d_thr = (f"{_rate(row['default_throughput'], row['seq_len'])} over {_n_runs(row['default_runs'])} "
             f"({_side_interval(row, 'default')})")
    if row["verdict"] == "default is fastest":
        others = row["candidates"] - 1
        return (f"{where}: the default settings (cell {row['default_cell_id']}) are the fastest found; "
                f"none of the {others} other {'cell' if others == 1 else 'cells'} that keep its accuracy "
                f"has a higher median throughput. Default: median {d_thr}.{_noise(row)}")
    changes = ", ".join(row["changes"] or []) or "the best cell"
    b_thr = (f"{_rate(row['best_throughput'], row['seq_len'])} median over {_n_runs(row['best_runs'])} "
             f"({_side_interval(row, 'best')})")
    evidence = f"{b_thr} against {d_thr}"
    accuracy = _accuracy(row)
    if row["verdict"] == "faster":
        return (f"{where}: {changes} makes {fw} {_speedup(row)} faster than its default "
                f"settings: {evidence}; {row['test']} p = {fmt_p(row['p_value'])}. {accuracy}{_noise(row)}")
    if row["verdict"] == "within 5 %":
        return (f"{where}: {fw}'s default settings are as fast as the best cell found, to 5 %: {changes} gives "
                f"{_speedup(row)}, an interval inside ±5 % ({row['test']} p = {fmt_p(row['p_value'])}). "
                f"{evidence}. {accuracy}{_noise(row)}")
    looks = f"{where}: {changes} looks {_speedup(row)} faster than {fw}'s default settings"
    if row["test"] == "interval overlap":
        return (f"{looks}, but with {_runs(row['best_runs'], row['default_runs'])} that is not significant "
                f"(p = {fmt_p(row['p_value'])}; so few runs cannot give p < 0.05 whatever they measure): "
                f"run at least {row['min_repeats']} repeats per side. {evidence}. {accuracy}{_noise(row)}")
    return (f"{looks}, but that is not significant ({row['test']} p = {fmt_p(row['p_value'])} over "
            f"{_runs(row['best_runs'], row['default_runs'])}): the difference may be noise. "
            f"{evidence}. {accuracy}{_noise(row)}")


def _speedup(row: dict[str, Any]) -> str:
    """The best cell's throughput over the default's, with its Hodges–Lehmann interval."""
    return fmt_ratio_ci(row["speedup"], row["speedup_low"], row["speedup_high"], row["speedup_level"])


def _no_default(row: dict[str, Any], fw: str) -> str:
    note = row["default_note"] or ""
    if note.startswith("ambiguous"):
        n = note.split()[1] if len(note.split()) > 1 else "several"
        return (f"{n} cells have {fw}'s default settings but differ in other parameters (such as "
                "epochs or seed), so there is no single default to measure a gain against; "
                "keep one of them per workload to compare against.")
    missing = row["missing_default"] or []
    how = ", ".join(missing) if missing else "the framework's default settings"
    like = f" (the other parameters as in cell {row['closest_cell_id']})" if row["closest_cell_id"] else ""
    return (f"no run with {fw}'s default settings, so no gain over them can be measured: "
            f"run a cell with {how}{like} to compare against.")


def _fastest(row: dict[str, Any]) -> str:
    if row["fastest_cell_id"] is None:
        return ""
    changes = ", ".join(row["fastest_changes"] or [])
    what = f" ({changes})" if changes else ""
    return (f" The fastest cell found is {row['fastest_cell_id']}{what}: "
            f"{_rate(row['fastest_throughput'], row['fastest_seq_len'])} median over {_n_runs(row['fastest_runs'])}.")


def _rate(throughput: float | None, seq_len: int | None) -> str:
    """A throughput with its unit: images/s, or a language model's tokens/s (and sequences/s)."""
    if seq_len and throughput is not None:
        return f"{fmt_num(throughput * seq_len)} tok/s ({fmt_num(throughput, 1)} seq/s)"
    return f"{fmt_num(throughput)} img/s"


def _accuracy(row: dict[str, Any]) -> str:
    if row["accuracy_change"] is None:
        return "No accuracy to compare."
    verdict = row["accuracy_verdict"] or "not tested"
    what = "Next-token accuracy" if row.get("seq_len") else "Accuracy"
    return f"{what} {fmt_points(row['accuracy_change'])} points ({verdict})."


def _noise(row: dict[str, Any]) -> str:
    noisy = [f"the {side}'s throughput is noisy (CV {row[f'{side}_throughput_cv']:.0%})"
             for side in ("default", "best") if row.get(f"{side}_noisy")
             and not (side == "best" and row["best_cell_id"] == row["default_cell_id"])]
    return (" Note: " + " and ".join(noisy) + ".") if noisy else ""


def to_json(rows: list[dict[str, Any]]) -> str:
    """The advice rows as a JSON list."""
    return json.dumps(rows, indent=2, default=str) + "\n"


def to_csv(rows: list[dict[str, Any]]) -> str:
    """One CSV row per workload; lists (changes, missing settings) joined by "; "."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["; ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else v)
                         for v in (row[c] for c in COLUMNS)])
    return buf.getvalue()
