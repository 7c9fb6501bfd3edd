-- What does each framework option change, everything else equal?  (STUDIES.md E: conv_algo
-- autotune vs heuristic, layout NHWC vs NCHW, "up to 2x"; precision; D Fig 3: oneDNN on vs
-- off.)  For each option (conv_algo, layout, precision, onednn) one row per pair of cells
-- that differ only in that option (same environment): the cell with a non-default value
-- against the cell with matrun's default value (heuristic, nchw, fp32, true).  A cell with
-- no such partner has no row.  throughput_ratio = throughput / ref throughput, speedup =
-- ref train s / train s, accuracy_change in percentage points; p_value, test, significant,
-- verdict: two-sided Mann-Whitney on the runs' throughput, accuracy_* on accuracy
-- (macro compare_samples).
-- throughput_ratio_low / _high / _level: the Hodges-Lehmann interval of throughput_ratio and its coverage
-- (compare_samples' ratio fields; docs/WAREHOUSE.md "Statistics"), NULL for the reference.
WITH opts AS (
    SELECT * FROM (VALUES ('conv_algo', 'heuristic'), ('layout', 'nchw'),
                          ('precision', 'fp32'), ('onednn', 'true')) AS t(option, ref_value)
),
s AS (
    SELECT o.option, o.ref_value, c.*,
        CASE o.option WHEN 'conv_algo' THEN c.conv_algo WHEN 'layout' THEN c.layout
                      WHEN 'precision' THEN c.precision ELSE CAST(c.onednn AS VARCHAR) END AS value,
        CASE o.option WHEN 'conv_algo' THEN c.config_conv_algo WHEN 'layout' THEN c.config_layout
                      WHEN 'precision' THEN c.config_precision ELSE c.config_onednn END AS config
    FROM cell_cache AS c CROSS JOIN opts AS o
),
pairs AS (
    SELECT x.*,
        r.cell_id AS ref_cell_id, r.runs AS ref_runs,
        r.train_s_median AS ref_train_s_median, r.throughput_median AS ref_throughput_median,
        r.accuracy_median AS ref_accuracy_median,
        compare_samples(x.throughput_values, r.throughput_values, level := least(x.design_level, r.design_level)) AS tcmp,
        compare_samples(x.accuracy_values, r.accuracy_values, level := least(x.design_level, r.design_level)) AS acmp
    FROM s AS x
    JOIN s AS r ON r.option = x.option AND r.config = x.config AND r.value = r.ref_value
    WHERE x.value IS DISTINCT FROM x.ref_value AND x.value IS NOT NULL
)
SELECT
    option, ref_value, value,
    config, framework, variant, model, dataset, device, mode, threads, batch_size,
    cell_id, ref_cell_id, runs, ref_runs,
    throughput_median, ref_throughput_median,
    throughput_median / ref_throughput_median              AS throughput_ratio,
    tcmp.ratio_low                                         AS throughput_ratio_low,
    tcmp.ratio_high                                        AS throughput_ratio_high,
    tcmp.ratio_level                                       AS throughput_ratio_level,
    train_s_median, ref_train_s_median,
    ref_train_s_median / train_s_median                    AS speedup,
    accuracy_median, ref_accuracy_median,
    (accuracy_median - ref_accuracy_median) * 100          AS accuracy_change,
    tcmp.p_value                                           AS p_value,
    tcmp.test                                              AS test,
    tcmp.significant                                       AS significant,
    verdict(tcmp, true, 'faster', 'slower')                AS verdict,
    acmp.p_value                                           AS accuracy_p_value,
    acmp.significant                                       AS accuracy_significant,
    verdict(acmp, true, 'more accurate', 'less accurate')  AS accuracy_verdict
FROM pairs
ORDER BY option, framework, model, dataset, device, config, value
