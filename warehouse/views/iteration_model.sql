-- Where does a training step's time go?  (Study C's per-iteration model, issue 16,
-- docs/MODEL.md.)  One row per cell and phase, over the cell's ok runs that sampled phases
-- (phase_sampling: every Nth timed step, recorded as phase 'sampled' and kept out of the
-- throughput).  phase: input, h2d, forward, backward, exchange, update, or phases the
-- framework runs fused, joined by '+' (never split); seconds_median: the median over the
-- sampled steps; share: of the sampled steps' median step time.  Per cell (repeated on each
-- of its rows): bottleneck (the phase with the largest median), fused (a fused phase is
-- there), sampled_step_s_median, step_s_median (the unsampled timed steps: what the
-- throughput is computed from), phases_s (the sum of the phase medians), gap_s / gap_share
-- (the median over the sampled steps of the step minus the sum of its phases: time no phase
-- accounts for — the step's own bookkeeping outside the phases, the clock itself), sampling_cost (the sampled steps' median over the
-- unsampled steps' - 1: what the phase clock and its device waits add to a sampled step;
-- the others pay nothing), gradient_bytes (one step's gradients: parameters x element size).
WITH ok AS (
    SELECT run_id, cell_id, sweep, params, gradient_bytes, phase_every
    FROM runs
    WHERE status = 'ok' AND run_id IN (SELECT run_id FROM step_phases)
),
ph AS (
    SELECT o.cell_id, p.phase, min(p.ordinal) AS ordinal, median(p.seconds) AS seconds_median,
        count(*) AS samples
    FROM step_phases AS p JOIN ok AS o USING (run_id)
    GROUP BY o.cell_id, p.phase
),
sampled AS (
    SELECT o.cell_id, median(s.step_seconds) AS sampled_step_s_median, count(*) AS sampled_steps,
        median(s.step_seconds - s.phases_s) AS gap_s
    FROM (SELECT run_id, step, any_value(step_seconds) AS step_seconds, sum(seconds) AS phases_s
          FROM step_phases GROUP BY run_id, step) AS s
    JOIN ok AS o USING (run_id)
    GROUP BY o.cell_id
),
unsampled AS (
    SELECT o.cell_id, median(s.seconds) AS step_s_median
    FROM steps AS s JOIN ok AS o USING (run_id)
    WHERE s.phase = 'timed'
    GROUP BY o.cell_id
),
cell AS (
    SELECT cell_id, arg_max(params, run_id) AS params, string_agg(DISTINCT sweep, ', ') AS sweeps,
        count(*) AS runs, max(gradient_bytes) AS gradient_bytes, max(phase_every) AS phase_every
    FROM ok GROUP BY cell_id
),
totals AS (
    SELECT cell_id, sum(seconds_median) AS phases_s, arg_max(phase, seconds_median) AS bottleneck,
        bool_or(contains(phase, '+')) AS fused
    FROM ph GROUP BY cell_id
)
SELECT
    c.cell_id,
    c.sweeps,
    c.params ->> 'framework'                                   AS framework,
    c.params ->> 'variant'                                     AS variant,
    c.params ->> 'model'                                       AS model,
    c.params ->> 'dataset'                                     AS dataset,
    c.params ->> 'device'                                      AS device,
    c.params ->> 'threads'                                     AS threads,
    TRY_CAST(c.params ->> 'batch_size' AS INTEGER)             AS batch_size,
    coalesce(TRY_CAST(c.params ->> 'workers' AS INTEGER), 1)   AS workers,
    coalesce(TRY_CAST(c.params ->> 'nodes' AS INTEGER), 1)     AS nodes,
    c.params ->> 'precision'                                   AS precision,
    c.params ->> 'input_pipeline'                              AS input_pipeline,
    c.runs,
    s.sampled_steps,
    c.phase_every,
    ph.phase,
    ph.ordinal,
    ph.samples,
    ph.seconds_median,
    ph.seconds_median / NULLIF(s.sampled_step_s_median, 0)    AS share,
    t.bottleneck,
    t.fused,
    s.sampled_step_s_median,
    u.step_s_median,
    t.phases_s,
    s.gap_s,
    s.gap_s / NULLIF(s.sampled_step_s_median, 0)              AS gap_share,
    s.sampled_step_s_median / NULLIF(u.step_s_median, 0) - 1  AS sampling_cost,
    c.gradient_bytes
FROM ph
JOIN cell AS c USING (cell_id)
JOIN sampled AS s USING (cell_id)
JOIN totals AS t USING (cell_id)
LEFT JOIN unsampled AS u USING (cell_id)
ORDER BY framework, model, dataset, device, workers, batch_size, cell_id, ph.ordinal
