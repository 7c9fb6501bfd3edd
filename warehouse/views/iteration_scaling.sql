-- Does the per-iteration model predict multi-worker scaling?  (Study C's model, studies B and
-- E's explanation of multi-GPU speedups by gradient transfer; issue 16, docs/MODEL.md.)  One
-- row per worker_scaling row with more than one worker whose reference cell (the 1-worker
-- cell of the same configuration: worker_scaling's ref_cell_id) sampled its phases.  The
-- prediction, from the reference's phases and the cell's own all-reduce calibration:
--   compute_s  = the reference's step (unsampled median) minus its own exchange phase (a
--                parameter-server framework exchanges with one worker too), x per-worker
--                batch / reference batch (strong scaling; 1 for weak scaling);
--   exchange_s = latency + gradient_bytes / bandwidth, the calibration's least-squares fit
--                (regr_intercept / regr_slope over exchange_calibration of the cell's runs:
--                the framework's own collective among these workers, this transport);
--   exposed_s  = exchange_s less the reference's backward phase where the framework
--                overlaps the exchange with backward (overlaps_backward), else exchange_s;
--   predicted_step_s = compute_s + exposed_s;
--   predicted_speedup = (global_batch / predicted_step_s) / (ref_global_batch / ref_step_s).
-- speedup: worker_scaling's measured speedup (throughput over the reference's), linear:
-- the number of workers; prediction_error = predicted_speedup / speedup - 1.  measured_step_s:
-- the cell's own unsampled step median.  forward_slowdown: the cell's forward phase over the
-- reference's (where both time it apart): above 1 the workers computed slower than one alone —
-- they contend for the host's cores, caches or memory bandwidth, which the model assumes they
-- do not (docs/MODEL.md "Assumptions").  NULL where the calibration is missing.
WITH cell_model AS (
    SELECT DISTINCT cell_id, step_s_median, sampled_step_s_median, gradient_bytes
    FROM iteration_model
),
ref_phases AS (
    SELECT cell_id,
        sum(seconds_median) FILTER (WHERE phase = 'forward')                           AS forward_s,
        sum(seconds_median) FILTER (WHERE contains(phase, 'exchange'))                 AS exchange_s,
        sum(seconds_median) FILTER (WHERE contains(phase, 'backward')
                                    AND NOT contains(phase, 'forward'))                AS backward_s
    FROM iteration_model GROUP BY cell_id
),
calibration AS (
    SELECT r.cell_id,
        regr_intercept(c.seconds, c.bytes)                                             AS latency_s,
        1.0 / NULLIF(regr_slope(c.seconds, c.bytes), 0)                                AS bandwidth_bytes_per_s,
        count(*)                                                                       AS points,
        any_value(r.summary -> 'exchange' -> 'calibration' ->> 'pattern')              AS pattern,
        any_value(r.summary -> 'exchange' -> 'calibration' ->> 'transport')            AS transport,
        bool_or(TRY_CAST(r.summary -> 'exchange' -> 'calibration' ->> 'overlaps_backward' AS BOOLEAN))
                                                                                       AS overlaps_backward,
        max(r.gradient_bytes)                                                          AS gradient_bytes
    FROM exchange_calibration AS c JOIN runs AS r USING (run_id)
    WHERE r.status = 'ok'
    GROUP BY r.cell_id
),
rows AS (
    SELECT w.config, w.framework, w.variant, w.model, w.dataset, w.device, w.kvstore, w.cell_id,
        w.gpus, w.nodes, w.workers, w.batch_size, w.global_batch, w.per_worker_batch, w.scaling,
        w.ref_cell_id, w.ref_global_batch, w.throughput_median, w.speedup, w.efficiency,
        rm.step_s_median                                                               AS ref_step_s,
        rp.exchange_s                                                                  AS ref_exchange_s,
        rp.backward_s                                                                  AS ref_backward_s,
        cm.step_s_median                                                               AS measured_step_s,
        cp.forward_s / NULLIF(rp.forward_s, 0)                                         AS forward_slowdown,
        greatest(k.latency_s, 0)                                                       AS latency_s,
        k.bandwidth_bytes_per_s, k.points AS calibration_points, k.pattern, k.transport,
        k.overlaps_backward,
        coalesce(k.gradient_bytes, rm.gradient_bytes)                                  AS gradient_bytes,
        CASE WHEN w.scaling = 'strong' THEN w.per_worker_batch / w.ref_global_batch ELSE 1.0 END AS scale
    FROM worker_scaling AS w
    JOIN cell_model AS rm ON rm.cell_id = w.ref_cell_id
    JOIN ref_phases AS rp ON rp.cell_id = w.ref_cell_id
    LEFT JOIN cell_model AS cm ON cm.cell_id = w.cell_id
    LEFT JOIN ref_phases AS cp ON cp.cell_id = w.cell_id
    LEFT JOIN calibration AS k ON k.cell_id = w.cell_id
    WHERE w.workers > 1
),
predicted AS (
    SELECT *,
        (ref_step_s - coalesce(ref_exchange_s, 0)) * scale                             AS compute_s,
        latency_s + gradient_bytes / bandwidth_bytes_per_s                             AS exchange_s
    FROM rows
),
exposed AS (
    SELECT *,
        CASE WHEN overlaps_backward THEN greatest(exchange_s - coalesce(ref_backward_s, 0) * scale, 0)
             ELSE exchange_s END                                                       AS exposed_s
    FROM predicted
)
SELECT
    config, framework, variant, model, dataset, device, kvstore, cell_id, ref_cell_id,
    gpus, nodes, workers, batch_size, global_batch, per_worker_batch, scaling,
    pattern, transport, overlaps_backward, gradient_bytes, calibration_points,
    latency_s, bandwidth_bytes_per_s,
    ref_step_s, ref_exchange_s, ref_backward_s, compute_s, exchange_s, exposed_s,
    compute_s + exposed_s                                                              AS predicted_step_s,
    measured_step_s,
    forward_slowdown,
    (global_batch / (compute_s + exposed_s)) / (ref_global_batch / ref_step_s)         AS predicted_speedup,
    speedup,
    workers                                                                            AS linear_speedup,
    efficiency,
    (global_batch / (compute_s + exposed_s)) / (ref_global_batch / ref_step_s) / speedup - 1 AS prediction_error
FROM exposed
ORDER BY framework, model, dataset, device, config, workers, cell_id
