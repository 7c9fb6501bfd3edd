-- How well does training scale over GPUs / workers / nodes?  (STUDIES.md A3 Table VIII, B4
-- Fig 5, B5-B6 Figs 6-7, E Fig 10.)  workers = params.workers, else gpus x nodes (each 1
-- when unset): cells have `gpus` today, `workers` / `nodes` later.  One row per cell whose
-- configuration (every parameter but gpus, workers, nodes and batch_size, same environment)
-- was run with two or more worker counts.  batch_size is the global batch (split over the
-- workers, as torch DataParallel does), per_worker_batch = batch_size / workers.  The
-- reference is the 1-worker cell of the configuration with the same per-worker batch
-- (weak scaling), else with the same global batch (strong scaling); scaling says which,
-- NULL without a 1-worker cell.  speedup = throughput / ref throughput, efficiency =
-- speedup / workers (1: linear), time_speedup = ref train s / train s; p_value, test,
-- significant, verdict: two-sided Mann-Whitney on the runs' throughput (compare_samples).
WITH s AS (
    SELECT *, config_id(params, ['gpus', 'workers', 'nodes', 'batch_size'], env_id) AS config
    FROM cell_stats
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(DISTINCT workers) >= 2
),
one AS (
    SELECT config, cell_id, batch_size FROM s WHERE workers = 1 AND runs > 0
),
matched AS (
    SELECT s.*,
        coalesce(weak.cell_id, strong.cell_id) AS ref_cell_id,
        CASE WHEN weak.cell_id IS NOT NULL THEN 'weak' WHEN strong.cell_id IS NOT NULL THEN 'strong' END AS scaling
    FROM s
    JOIN grp USING (config)
    LEFT JOIN one AS weak ON weak.config = s.config AND weak.batch_size * s.workers = s.batch_size
    LEFT JOIN one AS strong ON strong.config = s.config AND strong.batch_size = s.batch_size
),
pairs AS (
    SELECT m.*,
        r.batch_size AS ref_batch_size,
        r.train_s_median AS ref_train_s_median, r.throughput_median AS ref_throughput_median,
        r.accuracy_median AS ref_accuracy_median,
        CASE WHEN m.cell_id <> r.cell_id THEN compare_samples(m.throughput_values, r.throughput_values) END AS tcmp
    FROM matched AS m
    LEFT JOIN cell_stats AS r ON r.cell_id = m.ref_cell_id
)
SELECT
    config, framework, variant, model, dataset, device, mode, epochs,
    cell_id, gpus, nodes, workers, batch_size, batch_size::DOUBLE / workers AS per_worker_batch,
    runs, failed_runs, oom_runs,
    train_s_median, train_s_ci_low, train_s_ci_high,
    throughput_median, throughput_ci_low, throughput_ci_high, throughput_noisy,
    accuracy_median,
    scaling, ref_cell_id, ref_batch_size,
    throughput_median / ref_throughput_median              AS speedup,
    throughput_median / ref_throughput_median / workers    AS efficiency,
    ref_train_s_median / train_s_median                    AS time_speedup,
    (accuracy_median - ref_accuracy_median) * 100          AS accuracy_change,
    tcmp.p_value                                           AS p_value,
    tcmp.test                                              AS test,
    CASE WHEN cell_id = ref_cell_id THEN false ELSE tcmp.significant END AS significant,
    CASE WHEN cell_id = ref_cell_id THEN 'reference'
         ELSE verdict(tcmp, true, 'faster', 'slower') END AS verdict
FROM pairs
ORDER BY framework, model, dataset, config, workers, batch_size, cell_id
