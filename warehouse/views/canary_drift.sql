-- How did the machine drift through each sweep?  One row per canary run ([sweep] canary,
-- docs/MATRIX.md: a run of the sweep's reference cell at the start, at intervals and at the
-- end of the sweep, under repeat canary_repeat(), never counted as one of the cell's repeats),
-- in the order they started; `canary` numbers them per (sweep, reference cell).
-- Over the series' ok canaries (docs/WAREHOUSE.md "Drift canary"): canary_median, their
-- median throughput; noise, the run-to-run noise as 1.0484 times the median absolute
-- difference of consecutive canaries (the standard deviation for normal noise; barely moved by
-- a slow drift or one step); the band, canary_median ± max(3 × noise, 2 % of canary_median),
-- given from three ok canaries on.  outside: this canary's throughput is beyond the band
-- (NULL: no band, or the canary did not end ok).  ratio_to_first / ratio_to_median: its
-- throughput over the first ok canary's and over canary_median.  runs_before: the sweep's
-- other runs that started after the canary before this one and before this one (a run
-- measured between two canaries outside the band is flagged drifted, per run).
WITH c AS (
    SELECT sweep, cell_id, run_id, attempt, status, started_at, ended_at, wall_seconds,
        CASE WHEN status = 'ok' THEN train_seconds END                AS train_seconds,
        CASE WHEN status = 'ok' THEN throughput END                   AS throughput,
        row_number() OVER (PARTITION BY sweep, cell_id ORDER BY started_at, run_id) AS canary
    FROM runs
    WHERE "repeat" = canary_repeat()
),
steps AS (
    SELECT sweep, cell_id, started_at, throughput,
        abs(throughput - lag(throughput) OVER (PARTITION BY sweep, cell_id ORDER BY started_at, run_id)) AS step
    FROM c
    WHERE throughput IS NOT NULL
),
series AS (
    SELECT sweep, cell_id,
        count(*)                                  AS ok_canaries,
        median(throughput)                        AS canary_median,
        arg_min(throughput, started_at)           AS first_throughput,
        1.0484 * median(step)                     AS noise
    FROM steps
    GROUP BY sweep, cell_id
),
band AS (
    SELECT *,
        CASE WHEN ok_canaries >= 3 THEN greatest(3 * noise, 0.02 * canary_median) END AS half_width
    FROM series
),
before AS (  -- the sweep's other runs, each counted at the first canary after it started
    SELECT n.sweep, n.cell_id, n.run_id, count(*) AS runs_before
    FROM (SELECT sweep, started_at FROM runs
          WHERE "repeat" <> canary_repeat() AND sweep IN (SELECT sweep FROM c)) AS r
    ASOF JOIN c AS n ON r.sweep = n.sweep AND r.started_at < n.started_at
    GROUP BY n.sweep, n.cell_id, n.run_id

)
SELECT
    c.sweep, c.cell_id, c.canary, c.run_id, c.status, c.started_at, c.ended_at, c.wall_seconds,
    c.train_seconds, c.throughput,
    c.throughput / NULLIF(b.first_throughput, 0)                      AS ratio_to_first,
    c.throughput / NULLIF(b.canary_median, 0)                         AS ratio_to_median,
    b.ok_canaries, b.canary_median, b.noise,
    b.canary_median - b.half_width                                    AS band_low,
    b.canary_median + b.half_width                                    AS band_high,
    CASE WHEN c.throughput IS NOT NULL AND b.half_width IS NOT NULL
         THEN abs(c.throughput - b.canary_median) > b.half_width END  AS outside,
    coalesce(n.runs_before, 0)                                        AS runs_before
FROM c
LEFT JOIN band AS b USING (sweep, cell_id)
LEFT JOIN before AS n USING (sweep, cell_id, run_id)
ORDER BY c.sweep, c.cell_id, c.canary
