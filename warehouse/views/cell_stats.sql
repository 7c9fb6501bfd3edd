-- How fast, how accurate and how repeatable is each cell?  One row per cell (cell_id, over
-- every sweep that ran it): its parameters, its outcome counts, and, over its ok runs, for
-- train_seconds (train_s), test_seconds (test_s), accuracy and throughput: n, median, the
-- exact 95 % confidence interval of the median (order statistics, macro median_ci: for
-- n <= 5 the full range [min, max] with its lower coverage in *_ci_level; NULL for n = 1),
-- coefficient of variation (stddev_samp / mean) and noisy (CV > 0.05; NULL below 2 runs),
-- plus the sorted values the comparison views test.  Throughput is the harness's median
-- images/s over the timed steps: warm-up steps are already left out.  A diverged run
-- (NaN loss) stopped early: its train and test times are left out (its accuracy is NULL,
-- its throughput counts); diverged_runs counts it.  workers is the cell's data-parallel
-- world (max(params.workers, gpus) x nodes), global_batch the samples of one optimizer step
-- (batch_size x workers x nodes with scaling = 'weak', else batch_size), exchange_s_median /
-- exchange_fraction_median rank 0's gradient-exchange seconds per step and their share of the
-- step, where the framework exposes them (summary.exchange; docs/HARNESS.md).  STUDIES.md A1
-- (Tables VI-VII) is this view at the framework-default cells; the sweep views build on it.
WITH r AS (
    SELECT
        o.* REPLACE (
            CASE WHEN x.diverged THEN NULL ELSE o.train_seconds END AS train_seconds,
            CASE WHEN x.diverged THEN NULL ELSE o.test_seconds END AS test_seconds),
        json_merge_patch(x.params, '{"timeout": null, "onednn_check": null}') AS identity,
        x.diverged,
        coalesce(probe_blas(x.probe, o.framework), i.blas)            AS run_blas,
        TRY_CAST(x.params ->> 'nodes' AS INTEGER)                      AS nodes,
        greatest(coalesce(TRY_CAST(x.params ->> 'workers' AS INTEGER), 1), coalesce(o.gpus, 1))
            * coalesce(TRY_CAST(x.params ->> 'nodes' AS INTEGER), 1)   AS workers,
        x.params ->> 'scaling'                                         AS scaling,
        CASE WHEN x.params ->> 'scaling' = 'weak'
             THEN o.batch_size * coalesce(TRY_CAST(x.params ->> 'workers' AS INTEGER), 1)
                              * coalesce(TRY_CAST(x.params ->> 'nodes' AS INTEGER), 1)
             ELSE o.batch_size END                                     AS global_batch,
        TRY_CAST(x.summary -> 'exchange' ->> 'seconds_median' AS DOUBLE)   AS exchange_seconds,
        TRY_CAST(x.summary -> 'exchange' ->> 'fraction_of_step' AS DOUBLE) AS exchange_fraction,
        CASE WHEN o.epochs > 0 AND coalesce(o.iterations, 0) = 0 AND NOT coalesce(x.diverged, false)
             THEN o.train_seconds / o.epochs END                       AS epoch_seconds
    FROM run_overview AS o
    JOIN runs AS x USING (run_id)
    LEFT JOIN images AS i ON i.tag = x.image_tag
),
cells AS (
    SELECT
        cell_id,
        list_sort(list_distinct(list(sweep)))        AS sweeps,
        any_value(env_id)                            AS env_id,
        any_value(framework)                         AS framework,
        any_value(variant)                           AS variant,
        coalesce(mode(run_blas) FILTER (WHERE status = 'ok'), mode(run_blas)) AS blas,
        any_value(device)                            AS device,
        any_value(mode)                              AS mode,
        any_value(model)                             AS model,
        any_value(dataset)                           AS dataset,
        any_value(threads)                           AS threads,
        any_value(interop_threads)                   AS interop_threads,
        any_value(batch_size)                        AS batch_size,
        any_value(epochs)                            AS epochs,
        any_value(iterations)                        AS iterations,
        any_value(optimizer)                         AS optimizer,
        any_value(lr)                                AS lr,
        any_value(onednn)                            AS onednn,
        any_value(layout)                            AS layout,
        any_value(precision)                         AS precision,
        any_value(conv_algo)                         AS conv_algo,
        any_value(gpus)                              AS gpus,
        any_value(nodes)                             AS nodes,
        any_value(workers)                           AS workers,
        any_value(scaling)                           AS scaling,
        any_value(global_batch)                      AS global_batch,
        any_value(preset)                            AS preset,
        any_value(cpuset)                            AS cpuset,
        any_value(seed)                              AS seed,
        any_value(identity)                          AS params,
        count(*) FILTER (WHERE status = 'ok')        AS runs,
        count(*) FILTER (WHERE status = 'failed')    AS failed_runs,
        count(*) FILTER (WHERE status = 'timeout')   AS timeout_runs,
        count(*) FILTER (WHERE status = 'oom')       AS oom_runs
    FROM r
    GROUP BY cell_id
),
ok AS (
    SELECT
        cell_id,
        count(*) FILTER (WHERE diverged)                                     AS diverged_runs,
        count(*) FILTER (WHERE len(mismatches) > 0)                          AS mismatch_runs,
        median(train_seconds) AS train_s_median, cv(train_seconds) AS train_s_cv,
        list(train_seconds ORDER BY train_seconds) FILTER (WHERE train_seconds IS NOT NULL) AS train_s_values,
        median(test_seconds) AS test_s_median, cv(test_seconds) AS test_s_cv,
        list(test_seconds ORDER BY test_seconds) FILTER (WHERE test_seconds IS NOT NULL) AS test_s_values,
        median(accuracy) AS accuracy_median, cv(accuracy) AS accuracy_cv,
        list(accuracy ORDER BY accuracy) FILTER (WHERE accuracy IS NOT NULL) AS accuracy_values,
        median(throughput) AS throughput_median, cv(throughput) AS throughput_cv,
        list(throughput ORDER BY throughput) FILTER (WHERE throughput IS NOT NULL) AS throughput_values,
        median(epoch_seconds)                                                AS epoch_s_median,
        median(inference_seconds)                                            AS inference_s_median,
        median(onednn_primitives)                                            AS onednn_primitives,
        median(cpu_user_avg)                                                 AS cpu_user_median,
        median(cpu_system_avg)                                               AS cpu_system_median,
        median(iowait_avg)                                                   AS iowait_median,
        median(cpu_total_avg)                                                AS cpu_total_median,
        median(rss_avg_bytes) / 1048576.0                                    AS rss_avg_mb,
        max(rss_peak_bytes) / 1048576.0                                      AS rss_peak_mb,
        max(peak_device_memory_bytes) / 1048576.0                            AS device_memory_peak_mb,
        median(exchange_seconds)                                             AS exchange_s_median,
        median(exchange_fraction)                                            AS exchange_fraction_median
    FROM r
    WHERE status = 'ok'
    GROUP BY cell_id
),
ci AS (
    SELECT *,
        median_ci(train_s_values) AS train_s_ci, median_ci(test_s_values) AS test_s_ci,
        median_ci(accuracy_values) AS accuracy_ci, median_ci(throughput_values) AS throughput_ci
    FROM ok
)
SELECT
    c.*,
    coalesce(ci.diverged_runs, 0) AS diverged_runs,
    coalesce(ci.mismatch_runs, 0) AS mismatch_runs,
    coalesce(len(train_s_values), 0) AS train_s_n, train_s_median,
    train_s_ci.low AS train_s_ci_low, train_s_ci.high AS train_s_ci_high, train_s_ci.level AS train_s_ci_level,
    train_s_cv, train_s_cv > 0.05 AS train_s_noisy, train_s_values,
    coalesce(len(test_s_values), 0) AS test_s_n, test_s_median,
    test_s_ci.low AS test_s_ci_low, test_s_ci.high AS test_s_ci_high, test_s_ci.level AS test_s_ci_level,
    test_s_cv, test_s_cv > 0.05 AS test_s_noisy, test_s_values,
    coalesce(len(accuracy_values), 0) AS accuracy_n, accuracy_median,
    accuracy_ci.low AS accuracy_ci_low, accuracy_ci.high AS accuracy_ci_high, accuracy_ci.level AS accuracy_ci_level,
    accuracy_cv, accuracy_cv > 0.05 AS accuracy_noisy, accuracy_values,
    coalesce(len(throughput_values), 0) AS throughput_n, throughput_median,
    throughput_ci.low AS throughput_ci_low, throughput_ci.high AS throughput_ci_high, throughput_ci.level AS throughput_ci_level,
    throughput_cv, throughput_cv > 0.05 AS throughput_noisy, throughput_values,
    epoch_s_median, inference_s_median, onednn_primitives,
    cpu_user_median, cpu_system_median, iowait_median, cpu_total_median,
    rss_avg_mb, rss_peak_mb, device_memory_peak_mb, exchange_s_median, exchange_fraction_median
FROM cells AS c
LEFT JOIN ci USING (cell_id)
ORDER BY c.framework, c.model, c.dataset, c.cell_id
