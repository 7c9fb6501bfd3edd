-- How do the math libraries compare: the framework's variant (its BLAS build) and oneDNN on
-- or off, with CPU use and memory?  (STUDIES.md A4-A5, Tables IX-XI; D Fig 3.)  One row per
-- cell whose configuration (every parameter but variant and onednn, environment ignored) was
-- run with at least two (variant, onednn) combinations.  blas is what the run's probe found
-- (else the image's record), onednn_primitives how many oneDNN primitives really executed.
-- The reference is the framework's default library in the same configuration: variant
-- "cpu" (any on the GPU) with onednn true (or null: a framework without oneDNN); if several
-- cells qualify, the one with the most
-- ok runs.  speedup = ref train s / train s; throughput_ratio = throughput / ref throughput;
-- accuracy_change in percentage points; p_value, test, significant, verdict: two-sided
-- Mann-Whitney on the runs' throughput (macro compare_samples), accuracy_* the same on
-- accuracy.
-- throughput_ratio_low / _high / _level: the Hodges-Lehmann interval of throughput_ratio and its coverage
-- (compare_samples' ratio fields; docs/WAREHOUSE.md "Statistics"), NULL for the reference.
WITH s AS (
    SELECT *, config_library AS config FROM cell_cache
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(DISTINCT (variant, onednn)) >= 2
),
ref AS (
    SELECT config, first(cell_id ORDER BY runs DESC, cell_id) AS ref_cell_id
    FROM s
    WHERE runs > 0 AND coalesce(onednn, true) AND (variant = 'cpu' OR device <> 'cpu')
    GROUP BY config
),
pairs AS (
    SELECT s.*, ref.ref_cell_id,
        r.variant AS ref_variant, r.blas AS ref_blas,
        r.train_s_median AS ref_train_s_median, r.throughput_median AS ref_throughput_median,
        r.accuracy_median AS ref_accuracy_median,
        CASE WHEN s.cell_id <> r.cell_id THEN compare_samples(s.throughput_values, r.throughput_values, level := least(s.design_level, r.design_level)) END AS tcmp,
        CASE WHEN s.cell_id <> r.cell_id THEN compare_samples(s.accuracy_values, r.accuracy_values, level := least(s.design_level, r.design_level)) END AS acmp
    FROM s
    JOIN grp USING (config)
    LEFT JOIN ref USING (config)
    LEFT JOIN s AS r ON r.cell_id = ref.ref_cell_id
)
SELECT
    config, framework, model, dataset, device, mode, threads, batch_size, epochs,
    cell_id, variant, blas, onednn, onednn_primitives, runs,
    train_s_median, train_s_ci_low, train_s_ci_high, train_s_noisy,
    test_s_median,
    accuracy_median,
    throughput_median, throughput_ci_low, throughput_ci_high, throughput_noisy,
    cpu_user_median, cpu_system_median, iowait_median, cpu_total_median,
    rss_avg_mb, rss_peak_mb,
    ref_cell_id, ref_variant, ref_blas,
    ref_train_s_median / train_s_median                    AS speedup,
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
ORDER BY framework, model, dataset, config, variant, onednn DESC, cell_id
