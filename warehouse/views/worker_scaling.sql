-- How well does training scale over GPUs / workers / nodes?  (STUDIES.md A3 Table VIII, B4
-- Fig 5, B5-B6 Figs 6-7, D weak scaling, E Fig 10.)  workers = max(params.workers, gpus) x
-- nodes (cell_stats).  One row per cell whose configuration (every parameter but gpus,
-- workers, nodes and batch_size; same environment) was run with two or more worker counts.
-- global_batch is the samples of one optimizer step (batch_size x workers with scaling =
-- 'weak', batch_size with 'strong' or a single-process gpus cell), per_worker_batch =
-- global_batch / workers.  The reference is the configuration's 1-worker cell with the same
-- per-worker batch (weak scaling) or the same global batch (strong scaling): the one the cell
-- declares (params.scaling) when that cell exists, else the other, else NULL; scaling says
-- which.  speedup = throughput / ref throughput, efficiency = speedup / workers (1: linear),
-- time_speedup = ref train s / train s; kvstore: MXNet's (dist_sync / dist_async, else NULL);
-- exchange_s_median / exchange_fraction_median: the
-- gradient exchange per step (cell_stats).  p_value, test, significant, verdict: two-sided
-- Mann-Whitney on the runs' throughput (compare_samples).
-- speedup_low / _high / _level: the Hodges-Lehmann interval of speedup and its coverage
-- (compare_samples' ratio fields; docs/WAREHOUSE.md "Statistics"), NULL for the reference.
WITH s AS (
    SELECT *, config_workers AS config FROM cell_cache
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(DISTINCT workers) >= 2
),
one AS (
    SELECT config, cell_id, global_batch FROM s WHERE workers = 1 AND runs > 0
),
-- the 1-worker cells of each cell's configuration with the same per-worker batch (weak) and
-- with the same global batch (strong); joined on config first, so that the join is hashed
weak AS (
    SELECT s.cell_id, o.cell_id AS weak_ref
    FROM s JOIN one AS o ON o.config = s.config
    WHERE o.global_batch * s.workers = s.global_batch
),
strong AS (
    SELECT s.cell_id, o.cell_id AS strong_ref
    FROM s JOIN one AS o ON o.config = s.config AND o.global_batch = s.global_batch
),
matched AS (
    SELECT s.*, weak.weak_ref, strong.strong_ref
    FROM s
    JOIN grp USING (config)
    LEFT JOIN weak USING (cell_id)
    LEFT JOIN strong USING (cell_id)
),
chosen AS (
    SELECT * EXCLUDE (scaling, weak_ref, strong_ref),
        CASE WHEN scaling = 'strong' THEN coalesce(strong_ref, weak_ref)
             ELSE coalesce(weak_ref, strong_ref) END AS ref_cell_id,
        CASE WHEN scaling = 'strong' AND strong_ref IS NOT NULL THEN 'strong'
             WHEN weak_ref IS NOT NULL AND (scaling IS DISTINCT FROM 'strong' OR strong_ref IS NULL) THEN 'weak'
             WHEN strong_ref IS NOT NULL THEN 'strong' END AS scaling
    FROM matched
),
pairs AS (
    SELECT m.*,
        r.batch_size AS ref_batch_size, r.global_batch AS ref_global_batch,
        r.train_s_median AS ref_train_s_median, r.throughput_median AS ref_throughput_median,
        r.accuracy_median AS ref_accuracy_median,
        CASE WHEN m.cell_id <> r.cell_id THEN compare_samples(m.throughput_values, r.throughput_values, level := least(m.design_level, r.design_level)) END AS tcmp
    FROM chosen AS m
    LEFT JOIN s AS r ON r.cell_id = m.ref_cell_id
)
SELECT
    config, framework, variant, model, dataset, device, mode, epochs, kvstore,
    cell_id, gpus, nodes, workers, batch_size, global_batch,
    global_batch::DOUBLE / workers AS per_worker_batch,
    runs, failed_runs, oom_runs,
    train_s_median, train_s_ci_low, train_s_ci_high,
    throughput_median, throughput_ci_low, throughput_ci_high, throughput_noisy,
    accuracy_median, exchange_s_median, exchange_fraction_median,
    scaling, ref_cell_id, ref_batch_size, ref_global_batch,
    throughput_median / ref_throughput_median              AS speedup,
    tcmp.ratio_low                                         AS speedup_low,
    tcmp.ratio_high                                        AS speedup_high,
    tcmp.ratio_level                                       AS speedup_level,
    throughput_median / ref_throughput_median / workers    AS efficiency,
    ref_train_s_median / train_s_median                    AS time_speedup,
    (accuracy_median - ref_accuracy_median) * 100          AS accuracy_change,
    tcmp.p_value                                           AS p_value,
    tcmp.test                                              AS test,
    ref_significant(cell_id = ref_cell_id, tcmp) AS significant,
    ref_verdict(cell_id = ref_cell_id, tcmp, true, 'faster', 'slower') AS verdict
FROM pairs
ORDER BY framework, model, dataset, config, workers, global_batch, cell_id
