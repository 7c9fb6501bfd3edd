-- Was a run measured while the machine had drifted?  One row per run (canary runs left out)
-- of a sweep that made canary runs ([sweep] canary; view canary_drift): the last ok canary
-- that started before it and the first ok canary that started after it, with their
-- throughput over the canaries' median and whether each was outside the band.  drift_flagged:
-- both were outside, so the run was measured while the canary had drifted beyond its spread
-- (docs/WAREHOUSE.md "Drift canary"); a run with a canary on one side only (before the first,
-- after the last) or next to a canary inside the band is not flagged.
WITH c AS (
    SELECT sweep, run_id, started_at, ratio_to_median, outside
    FROM canary_drift
    WHERE throughput IS NOT NULL
),
r AS (
    SELECT run_id, sweep, cell_id, "repeat", attempt, status, started_at, throughput
    FROM runs
    WHERE "repeat" <> canary_repeat() AND sweep IN (SELECT sweep FROM c)
)
SELECT
    r.run_id, r.sweep, r.cell_id, r."repeat", r.attempt, r.status, r.started_at, r.throughput,
    b.run_id                                      AS canary_before,
    b.ratio_to_median                             AS before_ratio,
    b.outside                                     AS before_outside,
    a.run_id                                      AS canary_after,
    a.ratio_to_median                             AS after_ratio,
    a.outside                                     AS after_outside,
    coalesce(b.outside AND a.outside, false)      AS drift_flagged
FROM r
ASOF LEFT JOIN c AS b ON r.sweep = b.sweep AND r.started_at >= b.started_at
ASOF LEFT JOIN c AS a ON r.sweep = a.sweep AND r.started_at <= a.started_at
ORDER BY r.sweep, r.started_at, r.run_id
