-- Every cell's statistics and what the study views read beside them, computed from the runs:
-- the rows each ingest keeps in `cell_cache` (migration 006, warehouse/materialise.py), which
-- the study views read (docs/WAREHOUSE.md "Views at scale").  Reading this view computes
-- them all, which takes seconds on a big warehouse.  One row per cell: the
-- statistics columns (the per-cell statistics view selects them and says what each is), then:
-- cpu_count (the hosts' largest), the values over the ok runs of the other metrics a study's
-- verdicts may test (epoch_s, rss_peak_mb, cpu_total, device_memory_peak_mb, and a language
-- model's tokens_per_second and perplexity from its summary; sorted),
-- memory_limit, layer_profile and kvstore from params, entries (macro params_entries of
-- params), config_* (the configuration of each sweep view, macro entries_config_id),
-- params_key (macro entries_key of every parameter) and epoch_rows (the cell's rows of the
-- per-epoch convergence view, in epoch order).  Each run's parameters and records are read
-- with run_overview's expressions.
-- Busy runs set aside ([sweep] rerun_busy; docs/WAREHOUSE.md "Busy runs"): an ok run that
-- started on a busy machine (runs.busy_start) is left out of every statistic and list of
-- values below (and so of every comparison, finding and advice built on them) when an ok run
-- of the same (cell, repeat) started clean (busy_start false or NULL); busy_set_aside counts
-- them.  A repeat whose ok runs all started busy keeps them (baseline's busy_runs flags them).
-- design_level: the smallest nominal level of the cell's ok runs that came from an adaptive
-- sweep ([sweep] repeats = { min, max }; runs.design_level), NULL when none did; the verdicts
-- compare the cell at that level instead of 0.05 (docs/WAREHOUSE.md "Statistics").
WITH x AS NOT MATERIALIZED (
    SELECT * FROM runs  -- materialise.py reads only the runs of the cells it computes again
),
r AS NOT MATERIALIZED (
    SELECT
        x.run_id, x.sweep, x.cell_id, x.status, x.env_id,
        x.status = 'ok' AND coalesce(x.busy_start, false)
            AND bool_or(x.status = 'ok' AND NOT coalesce(x.busy_start, false))
                OVER (PARTITION BY x.cell_id, x."repeat")                 AS set_aside,
        x.params ->> 'framework'                                       AS framework,
        x.params ->> 'variant'                                         AS variant,
        x.params ->> 'model'                                           AS model,
        x.params ->> 'dataset'                                         AS dataset,
        x.params ->> 'device'                                          AS device,
        x.params ->> 'threads'                                         AS threads,
        TRY_CAST(x.params ->> 'batch_size' AS INTEGER)                 AS batch_size,
        TRY_CAST(x.params ->> 'epochs' AS INTEGER)                     AS epochs,
        TRY_CAST(x.params ->> 'iterations' AS INTEGER)                 AS iterations,
        x.params ->> 'optimizer'                                       AS optimizer,
        TRY_CAST(x.params ->> 'lr' AS DOUBLE)                          AS lr,
        TRY_CAST(x.params ->> 'onednn' AS BOOLEAN)                     AS onednn,
        x.params ->> 'cpuset'                                          AS cpuset,
        CASE WHEN x.diverged THEN NULL ELSE x.train_seconds END        AS train_seconds,
        CASE WHEN x.diverged THEN NULL ELSE x.test_seconds END         AS test_seconds,
        x.accuracy, x.throughput, x.cpu_user_avg, x.cpu_system_avg, x.cpu_total_avg, x.iowait_avg,
        x.rss_avg_bytes, x.rss_peak_bytes, x.mismatches, x.design_level,
        x.params ->> 'mode'                                            AS mode,
        x.params ->> 'layout'                                          AS layout,
        x.params ->> 'precision'                                       AS precision,
        x.params ->> 'conv_algo'                                       AS conv_algo,
        TRY_CAST(x.params ->> 'gpus' AS INTEGER)                       AS gpus,
        x.params ->> 'interop_threads'                                 AS interop_threads,
        x.params ->> 'preset'                                          AS preset,
        TRY_CAST(x.params ->> 'seed' AS INTEGER)                       AS seed,
        TRY_CAST(x.summary ->> 'inference_seconds' AS DOUBLE)          AS inference_seconds,
        TRY_CAST(x.summary ->> 'peak_device_memory_bytes' AS BIGINT)   AS peak_device_memory_bytes,
        TRY_CAST(x.probe ->> 'onednn_primitives' AS BIGINT)            AS onednn_primitives,
        TRY_CAST(x.summary ->> 'tokens_per_second' AS DOUBLE)          AS tokens_per_second,
        coalesce(TRY_CAST(x.summary ->> 'seq_len' AS INTEGER),
                 TRY_CAST(x.params ->> 'seq_len' AS INTEGER))          AS seq_len,
        TRY_CAST(x.summary ->> 'perplexity' AS DOUBLE)                 AS perplexity,
        json_merge_patch(x.params, '{"timeout": null, "onednn_check": null}') AS identity,
        x.diverged,
        coalesce(probe_blas(x.probe, x.params ->> 'framework'), i.blas) AS run_blas,
        TRY_CAST(x.params ->> 'nodes' AS INTEGER)                      AS nodes,
        greatest(coalesce(TRY_CAST(x.params ->> 'workers' AS INTEGER), 1),
                 coalesce(TRY_CAST(x.params ->> 'gpus' AS INTEGER), 1))
            * coalesce(TRY_CAST(x.params ->> 'nodes' AS INTEGER), 1)   AS workers,
        x.params ->> 'scaling'                                         AS scaling,
        CASE WHEN x.params ->> 'scaling' = 'weak'
             THEN TRY_CAST(x.params ->> 'batch_size' AS INTEGER)
                  * coalesce(TRY_CAST(x.params ->> 'workers' AS INTEGER), 1)
                  * coalesce(TRY_CAST(x.params ->> 'nodes' AS INTEGER), 1)
             ELSE TRY_CAST(x.params ->> 'batch_size' AS INTEGER) END   AS global_batch,
        TRY_CAST(x.summary -> 'exchange' ->> 'seconds_median' AS DOUBLE)   AS exchange_seconds,
        TRY_CAST(x.summary -> 'exchange' ->> 'fraction_of_step' AS DOUBLE) AS exchange_fraction,
        CASE WHEN TRY_CAST(x.params ->> 'epochs' AS INTEGER) > 0
                  AND coalesce(TRY_CAST(x.params ->> 'iterations' AS INTEGER), 0) = 0
                  AND NOT coalesce(x.diverged, false)
             THEN x.train_seconds / TRY_CAST(x.params ->> 'epochs' AS INTEGER) END AS epoch_seconds,
        TRY_CAST(x.host ->> 'cpu_count' AS INTEGER)                    AS cpu_count
    FROM x
    LEFT JOIN images AS i ON i.tag = x.image_tag
    WHERE x."repeat" <> canary_repeat()  -- canary runs ([sweep] canary) are no repeats
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
        max(seq_len)                                 AS seq_len,
        any_value(identity)                          AS params,
        count(*) FILTER (WHERE status = 'ok')        AS runs,
        count(*) FILTER (WHERE status = 'failed')    AS failed_runs,
        count(*) FILTER (WHERE status = 'timeout')   AS timeout_runs,
        count(*) FILTER (WHERE status = 'oom')       AS oom_runs,
        count(*) FILTER (WHERE set_aside)            AS busy_set_aside,
        max(cpu_count)                               AS cpu_count
    FROM r
    GROUP BY cell_id
),
ok AS (
    SELECT
        cell_id,
        count(*) FILTER (WHERE diverged)                                     AS diverged_runs,
        count(*) FILTER (WHERE len(mismatches) > 0)                          AS mismatch_runs,
        min(design_level)                                                    AS design_level,
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
        median(exchange_fraction)                                            AS exchange_fraction_median,
        median(tokens_per_second)                                            AS tokens_per_second_median,
        median(perplexity)                                                   AS perplexity_median,
        list(tokens_per_second ORDER BY tokens_per_second)
            FILTER (WHERE tokens_per_second IS NOT NULL)                     AS tokens_per_second_values,
        list(perplexity ORDER BY perplexity) FILTER (WHERE perplexity IS NOT NULL) AS perplexity_values,
        list(epoch_seconds ORDER BY epoch_seconds) FILTER (WHERE epoch_seconds IS NOT NULL) AS epoch_s_values,
        list(rss_peak_bytes / 1048576.0 ORDER BY rss_peak_bytes)
            FILTER (WHERE rss_peak_bytes IS NOT NULL)                        AS rss_peak_mb_values,
        list(cpu_total_avg ORDER BY cpu_total_avg) FILTER (WHERE cpu_total_avg IS NOT NULL) AS cpu_total_values,
        list(peak_device_memory_bytes / 1048576.0 ORDER BY peak_device_memory_bytes)
            FILTER (WHERE peak_device_memory_bytes IS NOT NULL)              AS device_memory_peak_mb_values
    FROM r
    WHERE status = 'ok' AND NOT set_aside
    GROUP BY cell_id
),
ci AS (
    SELECT *,
        median_ci(train_s_values) AS train_s_ci, median_ci(test_s_values) AS test_s_ci,
        median_ci(accuracy_values) AS accuracy_ci, median_ci(throughput_values) AS throughput_ci
    FROM ok
),
stats AS (
    SELECT
        c.* EXCLUDE (cpu_count, busy_set_aside),
        coalesce(ci.diverged_runs, 0) AS diverged_runs,
        coalesce(ci.mismatch_runs, 0) AS mismatch_runs,
        c.busy_set_aside,
        ci.design_level,
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
        rss_avg_mb, rss_peak_mb, device_memory_peak_mb, exchange_s_median, exchange_fraction_median,
        tokens_per_second_median, perplexity_median,
        c.cpu_count, ci.epoch_s_values, ci.rss_peak_mb_values, ci.cpu_total_values,
        ci.device_memory_peak_mb_values, ci.tokens_per_second_values, ci.perplexity_values
    FROM cells AS c
    LEFT JOIN ci USING (cell_id)
),
facts AS (
    SELECT *,
        TRY_CAST(params ->> 'memory_limit' AS BIGINT)                    AS memory_limit,
        TRY_CAST(params ->> 'layer_profile' AS BOOLEAN)                  AS layer_profile,
        params ->> 'kvstore'                                             AS kvstore,
        params_entries(params)                                           AS entries
    FROM stats
),
configs AS (
    SELECT *,
        entries_config_id(entries, ['threads'], env_id)                  AS config_threads,
        entries_config_id(entries, ['batch_size'], env_id)               AS config_batch,
        entries_config_id(entries, ['batch_size', 'epochs', 'iterations', 'lr'], env_id) AS config_lr_grid,
        entries_config_id(entries, ['epochs', 'iterations'], env_id)     AS config_length,
        entries_config_id(entries, ['gpus', 'workers', 'nodes', 'batch_size'], env_id) AS config_workers,
        entries_config_id(entries, ['variant', 'onednn'], NULL)          AS config_library,
        entries_config_id(entries, ['conv_algo'], env_id)                AS config_conv_algo,
        entries_config_id(entries, ['layout'], env_id)                   AS config_layout,
        entries_config_id(entries, ['precision'], env_id)                AS config_precision,
        entries_config_id(entries, ['onednn'], env_id)                   AS config_onednn,
        entries_key(entries, [])                                         AS params_key
    FROM facts
),
epoch_stats AS (
    SELECT r.cell_id, e.epoch,
        count(*)                                  AS runs,
        avg(e.test_accuracy)                      AS test_accuracy_mean,
        sd(e.test_accuracy)                       AS test_accuracy_sd,
        min(e.test_accuracy)                      AS test_accuracy_min,
        max(e.test_accuracy)                      AS test_accuracy_max,
        median(e.test_accuracy)                   AS test_accuracy_median,
        median_ci(list(e.test_accuracy) FILTER (WHERE e.test_accuracy IS NOT NULL)) AS acc_ci,
        avg(e.train_accuracy)                     AS train_accuracy_mean,
        avg(e.train_loss)                         AS train_loss_mean,
        median(e.epoch_seconds)                   AS epoch_s_median,
        median_ci(list(e.epoch_seconds) FILTER (WHERE e.epoch_seconds IS NOT NULL)) AS time_ci
    FROM epochs AS e
    JOIN r USING (run_id)
    WHERE r.status = 'ok' AND NOT r.set_aside
    GROUP BY r.cell_id, e.epoch
),
epoch_rows AS (
    SELECT cell_id, list(er ORDER BY er.epoch) AS epoch_rows
    FROM (
        SELECT cell_id, struct_pack(
            epoch := epoch, runs := runs,
            test_accuracy_mean := test_accuracy_mean, test_accuracy_sd := test_accuracy_sd,
            test_accuracy_min := test_accuracy_min, test_accuracy_max := test_accuracy_max,
            test_accuracy_median := test_accuracy_median,
            test_accuracy_ci_low := acc_ci.low, test_accuracy_ci_high := acc_ci.high,
            test_accuracy_ci_level := acc_ci.level,
            train_accuracy_mean := train_accuracy_mean, train_loss_mean := train_loss_mean,
            epoch_s_median := epoch_s_median, epoch_s_ci_low := time_ci.low, epoch_s_ci_high := time_ci.high,
            elapsed_s := sum(epoch_s_median) OVER (PARTITION BY cell_id ORDER BY epoch)) AS er
        FROM epoch_stats
    )
    GROUP BY cell_id
)
SELECT c.*, e.epoch_rows
FROM configs AS c
LEFT JOIN epoch_rows AS e USING (cell_id)
