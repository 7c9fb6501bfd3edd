-- How do speed, time per epoch and accuracy change with the batch size, in training and in
-- inference?  (STUDIES.md A8, Tables XV-XVIII: per-epoch and total time, accuracy; B3 Fig 4:
-- training images/s; B2 Fig 3: inference images/s, the rows with mode 'inference'.)  One
-- row per cell whose configuration (every parameter but batch_size, same environment) was
-- run with two or more batch sizes.  The reference is the smallest batch size with ok
-- runs.  speedup = ref train s / train s, epoch_speedup = ref s per epoch / s per epoch,
-- throughput_ratio = throughput / ref throughput; p_value, test, significant, verdict:
-- two-sided Mann-Whitney on the runs' throughput, accuracy_* on accuracy, against the
-- reference (macro compare_samples).  oom_runs / failed_runs count the runs that did not
-- finish (a batch too large for memory).
-- throughput_ratio_low / _high / _level: the Hodges-Lehmann interval of throughput_ratio and its coverage
-- (compare_samples' ratio fields; docs/WAREHOUSE.md "Statistics"), NULL for the reference.
WITH s AS (
    SELECT *, config_batch AS config FROM cell_cache
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(DISTINCT batch_size) >= 2
),
ref AS (
    SELECT config, arg_min(cell_id, batch_size) AS ref_cell_id, min(batch_size) AS ref_batch_size
    FROM s WHERE runs > 0 AND batch_size IS NOT NULL GROUP BY config
),
pairs AS (
    SELECT s.*, ref.ref_cell_id, ref.ref_batch_size,
        r.train_s_median AS ref_train_s_median, r.epoch_s_median AS ref_epoch_s_median,
        r.throughput_median AS ref_throughput_median, r.accuracy_median AS ref_accuracy_median,
        CASE WHEN s.cell_id <> r.cell_id THEN compare_samples(s.throughput_values, r.throughput_values, level := least(s.design_level, r.design_level)) END AS tcmp,
        CASE WHEN s.cell_id <> r.cell_id THEN compare_samples(s.accuracy_values, r.accuracy_values, level := least(s.design_level, r.design_level)) END AS acmp
    FROM s
    JOIN grp USING (config)
    LEFT JOIN ref USING (config)
    LEFT JOIN s AS r ON r.cell_id = ref.ref_cell_id
)
SELECT
    config, framework, variant, model, dataset, device, mode, threads, epochs, iterations,
    optimizer, lr,
    cell_id, batch_size, runs, failed_runs, oom_runs,
    train_s_median, train_s_ci_low, train_s_ci_high, train_s_noisy,
    epoch_s_median, test_s_median, inference_s_median,
    throughput_median, throughput_ci_low, throughput_ci_high, throughput_noisy,
    accuracy_median, accuracy_ci_low, accuracy_ci_high,
    ref_batch_size, ref_cell_id,
    ref_train_s_median / train_s_median                    AS speedup,
    ref_epoch_s_median / epoch_s_median                    AS epoch_speedup,
    throughput_median / ref_throughput_median              AS throughput_ratio,
    tcmp.ratio_low                                         AS throughput_ratio_low,
    tcmp.ratio_high                                        AS throughput_ratio_high,
    tcmp.ratio_level                                       AS throughput_ratio_level,
    (accuracy_median - ref_accuracy_median) * 100          AS accuracy_change,
    tcmp.p_value                                           AS p_value,
    tcmp.test                                              AS test,
    ref_significant(cell_id = ref_cell_id, tcmp) AS significant,
    ref_verdict(cell_id = ref_cell_id, tcmp, true, 'faster', 'slower') AS verdict,
    acmp.p_value                                           AS accuracy_p_value,
    ref_significant(cell_id = ref_cell_id, acmp) AS accuracy_significant,
    ref_verdict(cell_id = ref_cell_id, acmp, true, 'more accurate', 'less accurate') AS accuracy_verdict
FROM pairs
ORDER BY framework, model, dataset, mode, config, batch_size, cell_id
