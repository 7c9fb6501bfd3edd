"""``matrun history``: a workload's metric across framework releases, and across dates.

A *workload* is a cell without its release: every identity parameter of ``runs.params`` but
``version`` (and the non-identity ``timeout`` and ``onednn_check``), with the framework; its
runs may come from any sweep and any environment.  A run's *release* is the ``version`` it
asked for (issue 29's cell parameter) or else the framework version its probe found in force
(``probe.framework_version``), so the history of a warehouse that has measured the same cells
before and after an upgrade of matrun's pins is there without any new key.

Each *point* is a workload at one release (``by = "release"``, releases in version order) or at
one sweep (``by = "sweep"``, sweeps in the order of their first run: the drift of one release
over dates).  Per point, over its ok runs (canary runs never; a run that started on a busy
machine left out while a clean ok run of its cell and repeat exists, as in the views): n, the
median of the metric and the exact confidence interval of the median (``median_ci``).
Neighbouring points are compared as ``compare`` compares two sweeps (``compare_samples``:
two-sided Mann-Whitney of the later point's runs against the earlier's, the ratio of medians
with its Hodges-Lehmann interval), and the p-values of one workload's comparisons are adjusted
for their number by Holm's step-down method (``holm``), which keeps the chance of calling any
of them a change by accident at 5 %.  ``verdict``: "faster" / "slower" (or "more accurate",
… by the metric's direction) when the adjusted p < 0.05, "within 5 %" when not but the ratio's
interval lies inside [1/1.05, 1.05], "not significant" otherwise, "interval overlap" when so few
runs could not reach p < 0.05 at all.  Reads only.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matrun.errors import InputError
from matrun.warehouse.compare import check_sweep, check_warehouse, fetch, fmt_num, fmt_p, fmt_ratio_ci, reader

@dataclass(frozen=True)
class Metric:
    sql: str  # the run's value, over ``runs`` as r
    larger_is_better: bool
    unit: str
    better: str  # the verdict's words for a significant change
    worse: str


METRICS: dict[str, Metric] = {
    "throughput": Metric("r.throughput", True, "img/s", "faster", "slower"),
    "train_s": Metric("CASE WHEN r.diverged THEN NULL ELSE r.train_seconds END", False, "s", "faster", "slower"),
    "test_s": Metric("CASE WHEN r.diverged THEN NULL ELSE r.test_seconds END", False, "s", "faster", "slower"),
    "accuracy": Metric("r.accuracy", True, "", "more accurate", "less accurate"),
    "tokens_per_second": Metric("TRY_CAST(r.summary ->> 'tokens_per_second' AS DOUBLE)", True, "tok/s",
                                "faster", "slower"),
    "perplexity": Metric("TRY_CAST(r.summary ->> 'perplexity' AS DOUBLE)", False, "", "better", "worse"),
}
BY = ("release", "sweep")
#: Equivalence margin of "within 5 %" (as advise's).
MARGIN = 1.05
ALPHA = 0.05

_SQL = """
WITH x AS (
    SELECT r.run_id, r.sweep, r.cell_id, r."repeat", r.env_id, r.started_at,
        r.params ->> 'framework' AS framework,
        coalesce(nullif(r.params ->> 'version', ''), r.probe ->> 'framework_version') AS release,
        params_key(json_merge_patch(r.params, '{"timeout": null, "onednn_check": null, "version": null}'),
                   []::VARCHAR[]) AS workload,
        json_merge_patch(r.params, '{"timeout": null, "onednn_check": null, "version": null}') AS params,
        {value} AS v,
        r.status = 'ok' AND coalesce(r.busy_start, false)
            AND bool_or(r.status = 'ok' AND NOT coalesce(r.busy_start, false))
                OVER (PARTITION BY r.cell_id, r."repeat") AS set_aside
    FROM runs AS r
    WHERE r.status = 'ok' AND r."repeat" <> canary_repeat()
),
points AS (
    SELECT framework, workload, {point} AS point, any_value(params) AS params,
        list_sort(list_distinct(list(release))) AS releases,
        list_sort(list_distinct(list(sweep))) AS sweeps,
        list_sort(list_distinct(list(env_id))) AS env_ids,
        min(started_at) AS first_started_at,
        list(v ORDER BY v) FILTER (WHERE v IS NOT NULL AND NOT isnan(v)) AS vals
    FROM x
    WHERE release IS NOT NULL AND NOT set_aside {filters}
    GROUP BY framework, workload, point
    HAVING len(vals) > 0
),
ordered AS (
    SELECT *,
        {order} AS sort_key,
        median_ci(vals) AS ci
    FROM points
),
chained AS (
    SELECT *,
        lag(point) OVER w AS prev_point, lag(vals) OVER w AS prev_vals,
        row_number() OVER w AS position
    FROM ordered
    WINDOW w AS (PARTITION BY framework, workload ORDER BY sort_key, point)
)
SELECT framework, workload, point, params, releases, sweeps, env_ids, position,
    CAST(first_started_at AS VARCHAR) AS first_started_at,
    len(vals) AS n, list_median(vals) AS median, ci.low AS ci_low, ci.high AS ci_high, ci.level AS ci_level,
    prev_point,
    CASE WHEN prev_vals IS NOT NULL THEN list_median(vals) / nullif(list_median(prev_vals), 0) END AS ratio,
    compare_samples(vals, prev_vals) AS cmp
FROM chained
ORDER BY framework, workload, position
"""

# Releases in version order: the numbers in the text compared as numbers ("2.10.0" after
# "2.9.1"), then the text ("2.13.0" before "2.13.0+cpu").
_RELEASE_ORDER = "list_transform(regexp_extract_all(point, '[0-9]+'), lambda d: TRY_CAST(d AS BIGINT))"

#: The columns of one point, in the order CSV gives them.
COLUMNS = ("framework", "workload", "label", "point", "position", "releases", "sweeps", "env_ids",
           "first_started_at", "n", "median", "ci_low", "ci_high", "ci_level", "prev_point", "ratio",
           "ratio_low", "ratio_high", "ratio_level", "p_value", "p_adjusted", "test", "verdict")


@dataclass
class History:
    metric: str
    by: str
    points: list[dict[str, Any]] = field(default_factory=list)

    def workloads(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for p in self.points:
            out.setdefault((p["framework"], p["workload"]), []).append(p)
        return out

    def largest_changes(self) -> list[dict[str, Any]]:
        """Per framework, the neighbour comparison with the largest change (|log ratio|)."""
        best: dict[str, dict[str, Any]] = {}
        for p in self.points:
            if p["ratio"] is None or p["ratio"] <= 0:
                continue
            size = abs(math.log(p["ratio"]))
            if p["framework"] not in best or size > abs(math.log(best[p["framework"]]["ratio"])):
                best[p["framework"]] = p
        return [best[f] for f in sorted(best)]


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of ``p_values`` (None stays None): the i-th smallest of the
    m given is multiplied by m - i + 1, each kept at least its predecessor's and at most 1."""
    given = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m, out, running = len(given), list(p_values), 0.0
    for rank, (p, i) in enumerate(given):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def history(*, warehouse: Path | str, metric: str = "throughput", by: str = "release",
            framework: str | None = None, sweep: str | None = None) -> History:
    """Every workload's points (releases, or sweeps) with the neighbour comparisons.

    ``framework`` keeps that framework's workloads; ``sweep`` the workloads that sweep ran (their
    runs are read from every sweep).  Raises :class:`InputError` for an unknown metric, ``by``,
    framework or sweep, or a missing warehouse.  Reads only.
    """
    _check(metric, by)
    path = check_warehouse(warehouse)
    with reader(path) as con:
        if sweep is not None:
            check_sweep(con, sweep, path)
        if framework is not None:
            have = [r["f"] for r in fetch(con, "SELECT DISTINCT params ->> 'framework' AS f FROM runs ORDER BY f")]
            if framework not in have:
                raise InputError(f"--framework: no run of {framework!r} in warehouse {path} "
                                 f"(frameworks: {', '.join(f for f in have if f) or 'none'})")
        return read_history(con, metric=metric, by=by, framework=framework, sweep=sweep)


def _check(metric: str, by: str) -> None:
    if metric not in METRICS:
        raise InputError(f"--metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    if by not in BY:
        raise InputError(f"--by: expected one of {', '.join(BY)}, got {by!r}")


def read_history(con: Any, *, metric: str = "throughput", by: str = "release", framework: str | None = None,
                 sweep: str | None = None) -> History:
    """``history`` over an open read-only connection (the report reads it so), no name checked."""
    _check(metric, by)
    m = METRICS[metric]
    point = "release" if by == "release" else "sweep"
    order = _RELEASE_ORDER if by == "release" else "[epoch(first_started_at)]"
    # only the filters asked for, each with its parameter, on the columns x extracted (an
    # "$x IS NULL OR …" form, or one on runs.params, went wrong on the lake's runs here:
    # DuckDB 1.5.5 with DuckLake selected nothing, or cast the JSON to a number)
    filters, params = [], {}
    if framework is not None:
        filters.append("AND framework = $framework")
        params["framework"] = framework
    if sweep is not None:  # the workloads the sweep ran, with their runs of every sweep
        filters.append("AND workload IN (SELECT workload FROM x WHERE sweep = $sweep)")
        params["sweep"] = sweep
    sql = (_SQL.replace("{value}", m.sql).replace("{point}", point).replace("{order}", order)
           .replace("{filters}", " ".join(filters)))
    rows = fetch(con, sql, params)
    result = History(metric, by)
    by_workload: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        cmp = row.pop("cmp") or {}
        row.update(ratio_low=cmp.get("ratio_low"), ratio_high=cmp.get("ratio_high"),
                   ratio_level=cmp.get("ratio_level"), p_value=cmp.get("p_value"), test=cmp.get("test"),
                   can_decide=cmp.get("test") not in (None, "interval overlap"))
        row["params"] = json.loads(row["params"]) if isinstance(row["params"], str) else row["params"]
        by_workload.setdefault((row["framework"], row["workload"]), []).append(row)
    for points in by_workload.values():
        adjusted = holm([p["p_value"] if p["can_decide"] else None for p in points])
        for p, adj in zip(points, adjusted):
            p["p_adjusted"] = adj
            p["verdict"] = _verdict(p, adj, m)
            del p["can_decide"]
        _label(points)
        result.points.extend(points)
    return result


def _verdict(p: dict[str, Any], adjusted: float | None, metric: Metric) -> str | None:
    """The words for a point against the one before it (None for a workload's first point)."""
    if p["prev_point"] is None or p["test"] is None:
        return None
    if p["test"] == "interval overlap":
        return "interval overlap"
    if adjusted is not None and adjusted < ALPHA:
        return metric.better if (p["ratio"] > 1) == metric.larger_is_better else metric.worse
    low, high = p["ratio_low"], p["ratio_high"]
    if low is not None and high is not None and low >= 1 / MARGIN and high <= MARGIN:
        return "within 5 %"
    return "not significant"


def _label(points: list[dict[str, Any]]) -> None:
    """A workload's name in words: framework, model, dataset, device and threads."""
    params = points[0]["params"] or {}
    words = [str(params.get(k)) for k in ("model", "dataset", "device") if params.get(k) is not None]
    threads = params.get("threads")
    if threads is not None:
        words.append(f"threads={threads}")
    for p in points:
        p["label"] = f"{params.get('framework', '?')} " + " ".join(words)


def sentences(result: History) -> list[str]:
    """Per framework, its largest change between neighbouring points, in words."""
    unit = METRICS[result.metric].unit
    out = []
    for p in result.largest_changes():
        what = f"{p['label']}: {p['prev_point']} → {p['point']}"
        ratio = fmt_ratio_ci(p["ratio"], p["ratio_low"], p["ratio_high"], p["ratio_level"])
        p_text = (f"Holm-adjusted p = {fmt_p(p['p_adjusted'])} (raw {fmt_p(p['p_value'])}, {p['test']})"
                  if p["p_adjusted"] is not None else f"{p['test']}: too few runs to decide")
        out.append(f"{p['framework']}: the largest change is {what}, {result.metric} {ratio} "
                   f"({fmt_num(p['median'], 2)} {unit} median over {p['n']} runs): "
                   f"{p['verdict']}; {p_text}.".replace("  ", " "))
    return out


def to_json(result: History) -> str:
    return json.dumps({"metric": result.metric, "by": result.by,
                       "points": [{k: p.get(k) for k in COLUMNS} for p in result.points]},
                      indent=2, default=str) + "\n"


def to_csv(result: History) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(COLUMNS)
    for p in result.points:
        writer.writerow([" ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else v)
                         for v in (p.get(c) for c in COLUMNS)])
    return buf.getvalue()
