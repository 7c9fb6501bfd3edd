-- How do accuracy and training time grow with the number of epochs (or iterations)?
-- (STUDIES.md A7, Tables XIII-XIV, Figs 2-4.)  One row per cell whose configuration (every
-- parameter but epochs and iterations, same environment) was run at two or more lengths of
-- the same unit: epochs (iterations 0) or iterations.  The reference is the shortest
-- length with ok runs.  time_ratio = train s / ref train s against length_ratio = length /
-- ref length; time_linearity = time_ratio / length_ratio (1: time proportional to the
-- length).  accuracy_change (percentage points) with accuracy_p_value, accuracy_test,
-- accuracy_significant, accuracy_verdict: two-sided Mann-Whitney on the runs' accuracy
-- against the reference (macro compare_samples).
WITH s AS (
    SELECT *, config_length AS config,
        CASE WHEN coalesce(iterations, 0) > 0 THEN 'iterations' ELSE 'epochs' END AS unit,
        CASE WHEN coalesce(iterations, 0) > 0 THEN iterations ELSE epochs END AS length
    FROM cell_cache
),
grp AS (
    SELECT config, unit FROM s WHERE length IS NOT NULL
    GROUP BY config, unit HAVING count(DISTINCT length) >= 2
),
ref AS (
    SELECT config, unit, arg_min(cell_id, length) AS ref_cell_id, min(length) AS ref_length
    FROM s WHERE runs > 0 AND length IS NOT NULL GROUP BY config, unit
),
pairs AS (
    SELECT s.*, ref.ref_cell_id, ref.ref_length,
        r.train_s_median AS ref_train_s_median, r.accuracy_median AS ref_accuracy_median,
        CASE WHEN s.cell_id <> r.cell_id THEN compare_samples(s.accuracy_values, r.accuracy_values, level := least(s.design_level, r.design_level)) END AS acmp
    FROM s
    JOIN grp USING (config, unit)
    LEFT JOIN ref USING (config, unit)
    LEFT JOIN s AS r ON r.cell_id = ref.ref_cell_id
)
SELECT
    config, framework, variant, model, dataset, device, threads, batch_size, optimizer, lr,
    cell_id, unit, length, epochs, iterations, runs, diverged_runs,
    train_s_median, train_s_ci_low, train_s_ci_high, train_s_noisy,
    epoch_s_median, test_s_median,
    accuracy_median, accuracy_ci_low, accuracy_ci_high,
    throughput_median,
    ref_length, ref_cell_id,
    train_s_median / ref_train_s_median                              AS time_ratio,
    length::DOUBLE / ref_length                                      AS length_ratio,
    (train_s_median / ref_train_s_median) / (length::DOUBLE / ref_length) AS time_linearity,
    (accuracy_median - ref_accuracy_median) * 100                    AS accuracy_change,
    acmp.p_value                                                     AS accuracy_p_value,
    acmp.test                                                        AS accuracy_test,
    ref_significant(cell_id = ref_cell_id, acmp) AS accuracy_significant,
    ref_verdict(cell_id = ref_cell_id, acmp, true, 'more accurate', 'less accurate') AS accuracy_verdict
FROM pairs
ORDER BY framework, model, dataset, config, unit, length, cell_id
