-- Does training get faster with more threads, and where does over-subscription start?
-- (STUDIES.md A6, Table XII.)  One row per cell whose configuration (every parameter but
-- threads, same environment) was run with at least two thread settings.  The reference is
-- the configuration's cell with the fewest threads given as a number (NULL if there is
-- none with ok runs); speedup = ref train s / train s, throughput_ratio = throughput / ref
-- throughput; p_value, test, significant, verdict: two-sided Mann-Whitney on the runs'
-- throughput against the reference (macro compare_samples).  fastest marks the highest
-- median throughput of the configuration.
-- throughput_ratio_low / _high / _level: the Hodges-Lehmann interval of throughput_ratio and its coverage
-- (compare_samples' ratio fields; docs/WAREHOUSE.md "Statistics"), NULL for the reference.
WITH s AS (
    SELECT *, config_threads AS config, TRY_CAST(threads AS INTEGER) AS threads_n
    FROM cell_cache
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(DISTINCT threads) >= 2
),
ref AS (
    SELECT config, arg_min(cell_id, threads_n) AS ref_cell_id, min(threads_n) AS ref_threads
    FROM s WHERE runs > 0 AND threads_n IS NOT NULL GROUP BY config
),
pairs AS (
    SELECT s.*, ref.ref_cell_id, ref.ref_threads,
        r.train_s_median AS ref_train_s_median, r.throughput_median AS ref_throughput_median,
        CASE WHEN s.cell_id <> r.cell_id THEN compare_samples(s.throughput_values, r.throughput_values, level := least(s.design_level, r.design_level)) END AS tcmp,
        s.throughput_median = max(s.throughput_median) OVER (PARTITION BY s.config) AS fastest
    FROM s
    JOIN grp USING (config)
    LEFT JOIN ref USING (config)
    LEFT JOIN s AS r ON r.cell_id = ref.ref_cell_id
)
SELECT
    config, framework, variant, model, dataset, device, mode, onednn, batch_size, epochs,
    cell_id, threads, threads_n, interop_threads, runs,
    train_s_median, train_s_ci_low, train_s_ci_high, train_s_cv, train_s_noisy,
    throughput_median, throughput_ci_low, throughput_ci_high, throughput_cv, throughput_noisy,
    accuracy_median,
    cpu_user_median, cpu_system_median, iowait_median, cpu_total_median, rss_peak_mb,
    ref_threads, ref_cell_id,
    ref_train_s_median / train_s_median        AS speedup,
    throughput_median / ref_throughput_median  AS throughput_ratio,
    tcmp.ratio_low                             AS throughput_ratio_low,
    tcmp.ratio_high                            AS throughput_ratio_high,
    tcmp.ratio_level                           AS throughput_ratio_level,
    tcmp.p_value                               AS p_value,
    tcmp.test                                  AS test,
    ref_significant(cell_id = ref_cell_id, tcmp) AS significant,
    ref_verdict(cell_id = ref_cell_id, tcmp, true, 'faster', 'slower') AS verdict,
    coalesce(fastest, false)                   AS fastest
FROM pairs
ORDER BY framework, model, dataset, config, threads_n NULLS LAST, cell_id
