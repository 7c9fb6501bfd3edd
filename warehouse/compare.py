"""``matrun compare A B``: the same cells measured twice, before and after a change.

A and B are two selections of runs: a sweep (``NAME`` or ``sweep:NAME``) or the run ids a
read-only query returns (``sql:SELECT run_id FROM run_overview WHERE …``).  Runs of A and B
are matched by their cell parameters: every identity parameter of ``runs.params`` (the
non-identity ``timeout`` and ``onednn_check`` never count), minus the ones the caller
names in ``ignore`` (the parameter the comparison changes on purpose, such as ``onednn``).
The environment (``env_id``, hence ``cell_id``) is *not* part of the match: a framework
upgrade or a driver change gives new environments, and that is what is compared.

Per matched cell the statistics are those of the views (docs/WAREHOUSE.md, "Statistics"),
computed in SQL by the macros of ``views/_macros.sql`` over the selected ok runs of each
side: medians, ``median_ci``, ``cv`` / noisy, ``compare_samples`` (two-sided Mann–Whitney U
of B's throughput against A's, "interval overlap" and never significant when the test
cannot reach p < 0.05) and ``verdict``; the throughput ratio B / A (of medians) with the
Hodges–Lehmann interval ``compare_samples`` gives (``throughput_ratio_low`` / ``_high`` /
``_level``); ``two_modes`` says whether a side's throughputs fall
into two modes (``bimodal``), view ``run_drift`` how many of its ok runs were measured while
the sweep's canary had drifted (``drifted_runs``).  A sweep's canary runs are never selected.
An ok run that started on a busy machine is left out of its side's statistics while that side
selects a clean ok run of the same (cell, repeat) (``busy_set_aside``; ``[sweep] rerun_busy``).
"""

from __future__ import annotations

import csv
import io
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb

from matrun.errors import InputError, QueryError, WarehouseError
from matrun.runner.harness.spec import PARAMS  # the cell parameters, declared once (stdlib only)
from matrun.warehouse import catalog
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.query import run_query

SIDES = ("A", "B")
#: Sweep names as matrix.toml allows them (runner/planning/matrix.py).
_SWEEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
#: Parameters every label may fall back on when no parameter varies between the cells.
_BASE_KEYS = ("framework", "model", "dataset", "device")


# -- the read-only path --------------------------------------------------------------------


def check_warehouse(warehouse: Path | str) -> Path:
    """``warehouse`` as a Path; a missing one is bad input (exit 2), not a failure."""
    path = Path(warehouse)
    if not path.exists():
        raise InputError(f"warehouse {path} does not exist; run `matrun sweep` or "
                         "`matrun ingest` first to create it")
    if path.is_dir() and not catalog.is_warehouse(path):
        raise InputError(f"warehouse {path} is a directory but not a matrun warehouse; give a "
                         "warehouse's path")
    return path


#: The views and macros compare and advise read.  A reader brings the views of a warehouse
#: another matrun version wrote up to date (warehouse/db.py); this guards the case it could not.
NEEDED_VIEWS = ("run_overview", "cell_stats", "default_cells", "best_vs_default")
NEEDED_MACROS = ("params_key", "median_ci", "cv", "compare_samples", "verdict", "mw_can_decide",
                 "framework_default_layout", "framework_default_conv_algo")


@contextmanager
def reader(warehouse: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection (external access off) to run matrun's own parameterised SQL."""
    with open_warehouse(warehouse, read_only=True) as wh:
        _require_views(wh.con, warehouse)
        yield wh.con


def _require_views(con: duckdb.DuckDBPyConnection, warehouse: Path) -> None:
    have = {r["name"] for r in fetch(
        con, "SELECT view_name AS name FROM duckdb_views() WHERE NOT internal "
             "UNION SELECT function_name FROM duckdb_functions() WHERE function_type = 'macro'")}
    missing = [n for n in (*NEEDED_VIEWS, *NEEDED_MACROS) if n not in have]
    if missing:
        raise WarehouseError(f"warehouse {warehouse} was written by an older matrun (it has no "
                             f"{', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}); "
                             "run `matrun ingest` on it once to update its views")


def fetch(con: duckdb.DuckDBPyConnection, sql: str,
          params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows of matrun's own ``sql`` as dicts (user SQL goes through ``run_query`` instead).

    A DuckDB error here is matrun's failure, not the user's input: a :class:`WarehouseError`.
    """
    try:
        cursor = con.execute(sql, params or {})
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
    except duckdb.Error as exc:
        text = str(exc).strip()
        raise WarehouseError(f"reading the warehouse failed: "
                             f"{text.splitlines()[0] if text else type(exc).__name__}") from None


def known_sweeps(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r["sweep"] for r in fetch(con, "SELECT DISTINCT sweep FROM runs ORDER BY sweep")]


def check_sweep(con: duckdb.DuckDBPyConnection, name: str, warehouse: Path, what: str = "--sweep") -> None:
    """Refuse a sweep name the warehouse has no run of, listing the ones it has."""
    sweeps = known_sweeps(con)
    if name not in sweeps:
        have = ", ".join(sweeps) if sweeps else "none: the warehouse has no runs"
        raise InputError(f"{what}: no sweep named {name!r} in warehouse {warehouse} (sweeps: {have})")


# -- selecting runs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """One side of the comparison: what the user wrote and the run ids it selects."""

    side: str
    text: str
    kind: str  # "sweep" or "sql"
    value: str  # the sweep name or the SQL
    run_ids: tuple[str, ...]

    def describe(self) -> str:
        return f"sweep {self.value}" if self.kind == "sweep" else f"sql: {self.value}"


def parse_selector(text: str, side: str) -> tuple[str, str]:
    """``(kind, value)`` of a selector: ``sweep:NAME``, ``sql:QUERY`` or a bare sweep name."""
    stripped = text.strip()
    if stripped.lower().startswith("sql:"):
        sql = stripped[4:].strip()
        if not sql:
            raise QueryError(f"{side}: sql: is followed by no query; write "
                             "sql:SELECT run_id FROM run_overview WHERE …")
        return "sql", sql
    name = stripped[6:].strip() if stripped.lower().startswith("sweep:") else stripped
    if not _SWEEP_NAME.match(name):
        raise InputError(
            f"{side}: {text!r} is not a sweep name; write a sweep as NAME or sweep:NAME, or a "
            "query as sql:SELECT run_id FROM run_overview WHERE …")
    return "sweep", name


def check_select(sql: str, side: str) -> None:
    """Refuse anything but exactly one SELECT statement, before it reaches the warehouse."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        text = str(exc).strip()
        raise QueryError(f"{side}: query failed: {text.splitlines()[0] if text else type(exc).__name__}") from None
    if len(statements) != 1:
        raise QueryError(f"{side}: the query must be one SELECT statement; it has {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryError(f"{side}: the query must be a SELECT that returns run ids; "
                         f"it is a {kind.name} statement")


def select_runs(text: str, *, side: str, warehouse: Path) -> Selection:
    """Resolve one selector to the run ids it selects (read-only; nothing is written)."""
    kind, value = parse_selector(text, side)
    if kind == "sweep":
        with reader(warehouse) as con:
            check_sweep(con, value, warehouse, what=side)
            ids = [r["run_id"] for r in fetch(
                con, "SELECT run_id FROM runs WHERE sweep = $s AND \"repeat\" <> canary_repeat() "
                     "ORDER BY run_id", {"s": value})]  # canary runs: view canary_drift
        return Selection(side, text, kind, value, tuple(ids))
    check_select(value, side)
    try:
        columns, rows = run_query(value, warehouse=warehouse)
    except QueryError as exc:
        raise QueryError(f"{side}: {exc}") from None
    if "run_id" in columns:
        index = columns.index("run_id")
    elif len(columns) == 1:
        index = 0
    else:
        raise QueryError(f"{side}: the query must return a run_id column; it returned "
                         f"{', '.join(columns) or 'no columns'}")
    ids = [row[index] for row in rows if row[index] is not None]
    if any(not isinstance(i, str) for i in ids):
        raise QueryError(f"{side}: the query's {columns[index]} column must hold run ids (text)")
    if not ids:
        raise InputError(f"{side}: the query selects no runs")
    return Selection(side, text, kind, value, tuple(dict.fromkeys(ids)))


# -- the comparison --------------------------------------------------------------------------

# Per side and match key: counts over the selected runs, statistics over their ok runs (a
# diverged run's times are left out, its throughput counts: as in views/cell_stats.sql; a run
# that started busy is set aside while a clean ok run of its (cell, repeat) is selected on the
# same side, as views/cell_facts_live.sql does, and counted in busy_set_aside).
COMPARE_SQL = """
WITH sel AS (
    SELECT 'a' AS side, unnest($a::VARCHAR[]) AS run_id
    UNION ALL
    SELECT 'b' AS side, unnest($b::VARCHAR[]) AS run_id
),
r AS (
    SELECT s.side, o.cell_id, o.env_id, o.status, coalesce(x.diverged, false) AS diverged,
        CASE WHEN x.diverged THEN NULL ELSE o.train_seconds END AS train_seconds,
        o.accuracy, o.throughput,
        params_key(x.params, $drop::VARCHAR[]) AS match_key,
        x.params, coalesce(d.drift_flagged, false) AS drifted, x.design_level,
        o.status = 'ok' AND coalesce(x.busy_start, false)
            AND bool_or(o.status = 'ok' AND NOT coalesce(x.busy_start, false))
                OVER (PARTITION BY s.side, o.cell_id, x."repeat") AS set_aside
    FROM sel AS s
    JOIN run_overview AS o USING (run_id)
    JOIN runs AS x USING (run_id)
    LEFT JOIN run_drift AS d USING (run_id)
),
counts AS (
    SELECT side, match_key,
        any_value(params) AS params,
        list_sort(list_distinct(list(cell_id))) AS cells,
        list_sort(list_distinct(list(env_id))) AS envs,
        count(*) FILTER (WHERE status = 'ok') AS runs,
        count(*) FILTER (WHERE status <> 'ok') AS failed_runs,
        count(*) FILTER (WHERE status = 'ok' AND drifted) AS drifted_runs,
        count(*) FILTER (WHERE set_aside) AS busy_set_aside
    FROM r
    GROUP BY side, match_key
),
ok AS (
    SELECT side, match_key,
        count(*) FILTER (WHERE diverged) AS diverged_runs,
        min(design_level) AS design_level,  -- an adaptive sweep's level (runs.design_level)
        median(train_seconds) AS train_s_median, cv(train_seconds) AS train_s_cv,
        list(train_seconds ORDER BY train_seconds) FILTER (WHERE train_seconds IS NOT NULL) AS train_s_values,
        median(throughput) AS throughput_median, cv(throughput) AS throughput_cv,
        list(throughput ORDER BY throughput) FILTER (WHERE throughput IS NOT NULL) AS throughput_values,
        median(accuracy) AS accuracy_median,
        list(accuracy ORDER BY accuracy) FILTER (WHERE accuracy IS NOT NULL) AS accuracy_values
    FROM r
    WHERE status = 'ok' AND NOT set_aside
    GROUP BY side, match_key
),
s AS (
    SELECT c.*, ok.* EXCLUDE (side, match_key),
        median_ci(ok.train_s_values) AS train_s_ci,
        median_ci(ok.throughput_values) AS throughput_ci,
        two_modes(ok.throughput_values).bimodal AS bimodal
    FROM counts AS c
    LEFT JOIN ok ON ok.side = c.side AND ok.match_key = c.match_key
),
pairs AS (
    SELECT coalesce(a.match_key, b.match_key) AS match_key,
        CASE WHEN a.match_key IS NULL THEN 'only B' WHEN b.match_key IS NULL THEN 'only A'
             ELSE 'both' END AS match,
        coalesce(a.params, b.params) AS params,
        a.cells AS a_cells, b.cells AS b_cells, a.envs AS a_envs, b.envs AS b_envs,
        a.runs AS a_runs, b.runs AS b_runs,
        a.failed_runs AS a_failed_runs, b.failed_runs AS b_failed_runs,
        coalesce(a.diverged_runs, 0) AS a_diverged_runs, coalesce(b.diverged_runs, 0) AS b_diverged_runs,
        a.train_s_median AS a_train_s, b.train_s_median AS b_train_s,
        a.train_s_ci.low AS a_train_s_ci_low, a.train_s_ci.high AS a_train_s_ci_high,
        b.train_s_ci.low AS b_train_s_ci_low, b.train_s_ci.high AS b_train_s_ci_high,
        a.train_s_cv AS a_train_s_cv, b.train_s_cv AS b_train_s_cv,
        a.throughput_median AS a_throughput, b.throughput_median AS b_throughput,
        a.throughput_ci.low AS a_throughput_ci_low, a.throughput_ci.high AS a_throughput_ci_high,
        a.throughput_ci.level AS a_throughput_ci_level,
        b.throughput_ci.low AS b_throughput_ci_low, b.throughput_ci.high AS b_throughput_ci_high,
        b.throughput_ci.level AS b_throughput_ci_level,
        a.throughput_cv AS a_throughput_cv, b.throughput_cv AS b_throughput_cv,
        coalesce(a.bimodal, false) AS a_bimodal, coalesce(b.bimodal, false) AS b_bimodal,
        coalesce(a.drifted_runs, 0) AS a_drifted_runs, coalesce(b.drifted_runs, 0) AS b_drifted_runs,
        coalesce(a.busy_set_aside, 0) AS a_busy_set_aside, coalesce(b.busy_set_aside, 0) AS b_busy_set_aside,
        a.accuracy_median AS a_accuracy, b.accuracy_median AS b_accuracy,
        compare_samples(b.throughput_values, a.throughput_values, level := least(b.design_level, a.design_level)) AS tcmp,
        compare_samples(b.accuracy_values, a.accuracy_values, level := least(b.design_level, a.design_level)) AS acmp
    FROM (SELECT * FROM s WHERE side = 'a') AS a
    FULL OUTER JOIN (SELECT * FROM s WHERE side = 'b') AS b ON a.match_key = b.match_key
)
SELECT * EXCLUDE (tcmp, acmp),
    a_throughput_cv > 0.05 OR a_train_s_cv > 0.05           AS a_noisy,
    b_throughput_cv > 0.05 OR b_train_s_cv > 0.05           AS b_noisy,
    b_train_s / a_train_s                                   AS time_ratio,
    b_throughput / a_throughput                             AS throughput_ratio,
    tcmp.ratio_low                                          AS throughput_ratio_low,
    tcmp.ratio_high                                         AS throughput_ratio_high,
    tcmp.ratio_level                                        AS throughput_ratio_level,
    (b_accuracy - a_accuracy) * 100                         AS accuracy_change,
    tcmp.p_value                                            AS p_value,
    tcmp.test                                               AS test,
    tcmp.significant                                        AS significant,
    verdict(tcmp, true, 'faster', 'slower')                 AS verdict,
    acmp.p_value                                            AS accuracy_p_value,
    acmp.significant                                        AS accuracy_significant,
    verdict(acmp, true, 'more accurate', 'less accurate')   AS accuracy_verdict
FROM pairs
"""

#: The columns of a compared cell, in the order CSV gives them.
COLUMNS = (
    "match", "label", "a_cells", "b_cells", "a_envs", "b_envs", "a_runs", "b_runs",
    "a_failed_runs", "b_failed_runs", "a_diverged_runs", "b_diverged_runs",
    "a_train_s", "b_train_s", "a_train_s_ci_low", "a_train_s_ci_high",
    "b_train_s_ci_low", "b_train_s_ci_high", "time_ratio",
    "a_throughput", "b_throughput", "a_throughput_ci_low", "a_throughput_ci_high",
    "a_throughput_ci_level", "b_throughput_ci_low", "b_throughput_ci_high",
    "b_throughput_ci_level", "throughput_ratio", "throughput_ratio_low", "throughput_ratio_high",
    "throughput_ratio_level",
    "a_train_s_cv", "b_train_s_cv", "a_throughput_cv", "b_throughput_cv", "a_noisy", "b_noisy",
    "a_bimodal", "b_bimodal", "a_drifted_runs", "b_drifted_runs", "a_busy_set_aside", "b_busy_set_aside",
    "a_accuracy", "b_accuracy", "accuracy_change",
    "p_value", "test", "significant", "verdict",
    "accuracy_p_value", "accuracy_significant", "accuracy_verdict", "params",
)


@dataclass
class Comparison:
    """The result of :func:`compare`: both selections, the matched cells and the rest."""

    a: Selection
    b: Selection
    ignored: tuple[str, ...]
    cells: list[dict[str, Any]] = field(default_factory=list)  # every row, matched or not

    @property
    def matched(self) -> list[dict[str, Any]]:
        return [c for c in self.cells if c["match"] == "both"]

    @property
    def only_a(self) -> list[dict[str, Any]]:
        return [c for c in self.cells if c["match"] == "only A"]

    @property
    def only_b(self) -> list[dict[str, Any]]:
        return [c for c in self.cells if c["match"] == "only B"]

    def counts(self) -> dict[str, int]:
        matched = self.matched
        return {
            "matched": len(matched),
            "faster": sum(c["verdict"] == "faster" for c in matched),
            "slower": sum(c["verdict"] == "slower" for c in matched),
            "not_significant": sum(c["verdict"] == "not significant" for c in matched),
            "too_few_repeats": sum(c["test"] == "interval overlap" for c in matched),
            "not_compared": sum(c["verdict"] is None for c in matched),
            "only_a": len(self.only_a),
            "only_b": len(self.only_b),
        }

    def summary(self) -> str:
        """One line: how many matched cells B made faster, slower, or not significantly either."""
        n = self.counts()
        parts = [f"{n['faster']} faster", f"{n['slower']} slower", f"{n['not_significant']} not significant"]
        if n["too_few_repeats"]:
            parts[-1] += f" ({n['too_few_repeats']} with too few repeats for the test to decide)"
        if n["not_compared"]:
            parts.append(f"{n['not_compared']} not compared (no ok run with a throughput on one side)")
        line = (f"{n['matched']} matched {_plural(n['matched'], 'cell')}, B against A: " + ", ".join(parts)
                + f"; {n['only_a']} only in A, {n['only_b']} only in B")
        return line


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def matching_keys(ignore: Sequence[str]) -> tuple[str, ...]:
    """Validate ``ignore`` against the known parameters; return the keys left out of the match."""
    for key in ignore:
        if key not in PARAMS:
            raise InputError(f"--ignore {key!r}: not a cell parameter (known: {', '.join(sorted(PARAMS))})")
        if not PARAMS[key].identity:
            raise InputError(f"--ignore {key!r}: {key} is never part of the match already")
    non_identity = tuple(name for name, p in PARAMS.items() if not p.identity)
    return tuple(dict.fromkeys([*non_identity, *ignore]))


def compare(a: str, b: str, *, warehouse: Path | str, ignore: Sequence[str] = ()) -> Comparison:
    """Compare the runs selected by ``a`` with those selected by ``b``, cell by matched cell.

    Raises :class:`InputError` (a :class:`QueryError` for the SQL) for an unknown sweep, an
    empty selection, SQL that is not one SELECT or fails, run ids not in the warehouse,
    selections that share runs, or a missing warehouse.  Reads only.
    """
    path = check_warehouse(warehouse)
    drop = matching_keys(ignore)
    sel_a = select_runs(a, side="A", warehouse=path)
    sel_b = select_runs(b, side="B", warehouse=path)
    for sel in (sel_a, sel_b):
        if not sel.run_ids:
            raise InputError(f"{sel.side}: {sel.describe()} selects no runs")
    shared = set(sel_a.run_ids) & set(sel_b.run_ids)
    if shared:
        example = sorted(shared)[0]
        raise InputError(f"A and B share {len(shared)} {_plural(len(shared), 'run')} (e.g. {example}): "
                         "a run cannot be compared with itself; make the selections disjoint")
    with reader(path) as con:
        for sel in (sel_a, sel_b):
            known = {r["run_id"] for r in fetch(
                con, "SELECT run_id FROM runs WHERE run_id IN (SELECT unnest($ids::VARCHAR[]))",
                {"ids": list(sel.run_ids)})}
            unknown = [i for i in sel.run_ids if i not in known]
            if unknown:
                raise InputError(f"{sel.side}: {len(unknown)} of the selected run ids "
                                 f"{'is' if len(unknown) == 1 else 'are'} not in the warehouse "
                                 f"(e.g. {unknown[0]!r})")
        rows = fetch(con, COMPARE_SQL, {"a": list(sel_a.run_ids), "b": list(sel_b.run_ids),
                                        "drop": list(drop)})
    for row in rows:
        params = json.loads(row["params"]) if row["params"] else {}
        row["params"] = {k: v for k, v in sorted(params.items()) if k not in drop and v is not None}
        del row["match_key"]
    _label(rows)
    rows.sort(key=lambda row: (("both", "only A", "only B").index(row["match"]), row["label"]))
    return Comparison(sel_a, sel_b, tuple(ignore), [{k: row.get(k) for k in COLUMNS} for row in rows])


def _label(rows: list[dict[str, Any]]) -> None:
    """A short name per row: the workload (framework, model, dataset, device) where it differs
    between the rows, then the parameters that differ between rows of one workload (so the
    batch size a framework's preset implies is not repeated on every row)."""
    def group(row: dict[str, Any]) -> tuple[str, ...]:
        return tuple(json.dumps(row["params"].get(k)) for k in _BASE_KEYS)

    base = [k for k in _BASE_KEYS if len({json.dumps(r["params"].get(k)) for r in rows}) > 1]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(group(row), []).append(row)
    keys = sorted({k for row in rows for k in row["params"]} - set(_BASE_KEYS))
    within = [k for k in keys
              if any(len({json.dumps(r["params"].get(k)) for r in members}) > 1 for members in groups.values())]
    if not base and not within:
        base = [k for k in _BASE_KEYS if any(k in r["params"] for r in rows)]
    for row in rows:
        row["label"] = " ".join([_value(row["params"].get(k)) for k in base]
                                + [f"{k}={_value(row['params'].get(k))}" for k in within])


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "-" if value is None else str(value)


# -- output ----------------------------------------------------------------------------------


def to_json(result: Comparison) -> str:
    """The whole comparison as JSON: both selections, the summary and every cell."""
    doc = {
        "a": {"selector": result.a.text, "kind": result.a.kind, "value": result.a.value,
              "runs": len(result.a.run_ids)},
        "b": {"selector": result.b.text, "kind": result.b.kind, "value": result.b.value,
              "runs": len(result.b.run_ids)},
        "ignored": list(result.ignored),
        "summary": {**result.counts(), "text": result.summary()},
        "cells": result.cells,
    }
    return json.dumps(doc, indent=2, default=str) + "\n"


def to_csv(result: Comparison) -> str:
    """One CSV row per cell (matched, only A, only B); lists space-separated, params as JSON."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(COLUMNS)
    for cell in result.cells:
        writer.writerow([_csv(cell[c]) for c in COLUMNS])
    return buf.getvalue()


def _csv(value: Any) -> Any:
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def fmt_ratio_ci(x: float | None, low: float | None, high: float | None, level: float | None) -> str:
    """A ratio with its interval, as macro ``fmt_ratio_ci`` words it: ``1.39× (1.31–1.47)``,
    ``1.39× (0.90–2.10 at 67 %)`` below 95 % coverage, ``1.39×`` without an interval."""
    if x is None or low is None or high is None:
        return fmt_ratio(x)
    at = f" at {level * 100:.0f} %" if level is not None and level < 0.95 else ""
    return f"{x:.2f}× ({low:.2f}–{high:.2f}{at})"


def fmt_num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.1e}" if p < 0.001 else f"{p:.3g}"


def fmt_points(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def fmt_noisy(cell: dict[str, Any]) -> str:
    """The sides whose spread is wide (CV over 5 %), with "bimodal" where their throughputs
    fall into two modes (macro two_modes) and "drift" where ok runs of theirs were measured
    while the sweep's canary had drifted (view run_drift): ``A``, ``B bimodal drift``, ``-``."""
    sides = []
    for s in ("a", "b"):
        marks = [" bimodal"] * bool(cell.get(f"{s}_bimodal")) + [" drift"] * bool(cell.get(f"{s}_drifted_runs"))
        if cell[f"{s}_noisy"] or marks:
            sides.append(s.upper() + "".join(marks))
    return " ".join(sides) or "-"
