-- One row per (sweep, cell) over its ok runs: time, accuracy, throughput and resources,
-- as median with min / max, and the coefficient of variation of throughput over repeats
-- (stddev_samp / mean; NULL with a single run).  Memory is in MiB (2^20 bytes): the median
-- over runs of each run's average RSS, and the highest peak of any run.  Flags counted like
-- mismatches: runs whose GPU throttled, runs that started on a busy machine; energy per image
-- (joules, GPU + CPU packages as measured, NULL where unmeasured) and NVML's peak GPU memory;
-- for a language model (docs/TRANSFORMERS.md) tokens/s and perplexity (NULL for the others).
SELECT
    sweep,
    cell_id,
    min(framework)                                   AS framework,
    min(variant)                                     AS variant,
    min(model)                                       AS model,
    min(dataset)                                     AS dataset,
    min(threads)                                     AS threads,
    min(batch_size)                                  AS batch_size,
    min(epochs)                                      AS epochs,
    count(*)                                         AS runs,
    median(train_seconds)                            AS train_s_median,
    min(train_seconds)                               AS train_s_min,
    max(train_seconds)                               AS train_s_max,
    median(test_seconds)                             AS test_s_median,
    median(accuracy)                                 AS accuracy_median,
    min(accuracy)                                    AS accuracy_min,
    max(accuracy)                                    AS accuracy_max,
    median(throughput)                               AS throughput_median,
    min(throughput)                                  AS throughput_min,
    max(throughput)                                  AS throughput_max,
    sd(throughput) / NULLIF(avg(throughput), 0) AS throughput_cv,
    median(cpu_total_avg)                            AS cpu_total_median,
    median(cpu_user_avg)                             AS cpu_user_median,
    median(cpu_system_avg)                           AS cpu_system_median,
    median(iowait_avg)                               AS iowait_median,
    median(rss_avg_bytes) / 1048576.0                AS rss_avg_mb,
    max(rss_peak_bytes) / 1048576.0                  AS rss_peak_mb,
    count(*) FILTER (WHERE len(mismatches) > 0)      AS mismatch_runs,
    count(*) FILTER (WHERE gpu_throttled)            AS throttled_runs,
    count(*) FILTER (WHERE busy_start)               AS busy_runs,
    median(j_per_image)                              AS j_per_image_median,
    median(gpu_mem_used_peak_bytes) / 1048576.0      AS gpu_mem_peak_mb,
    median(tokens_per_second)                        AS tokens_per_second_median,
    median(perplexity)                               AS perplexity_median,
    min(perplexity)                                  AS perplexity_min,
    max(perplexity)                                  AS perplexity_max
FROM run_overview
WHERE status = 'ok'
GROUP BY sweep, cell_id
ORDER BY sweep, framework, model, dataset, cell_id
