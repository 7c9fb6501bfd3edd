-- How much CPU, host memory and device memory does a cell use as the batch grows, and when
-- does it run out?  (STUDIES.md A11, Table XXII: CPU % user / system / iowait and memory,
-- swapping seen as iowait; B1 Fig 2: GPU memory vs batch size.)  One row per cell whose
-- configuration (every parameter but batch_size, same environment) was run with two or
-- more batch sizes, failed cells included (oom_runs: killed for memory).  CPU columns are
-- medians over ok runs of each run's average, in percent of one core; rss_avg_mb the median
-- of each run's average RSS, rss_peak_mb and device_memory_peak_mb (the framework's peak
-- allocation on the GPU(s)) the highest of any ok run, in MiB; memory_limit_mb the cell's
-- memory limit (NULL: none).
WITH s AS (
    SELECT *, config_batch AS config FROM cell_cache
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(DISTINCT batch_size) >= 2
)
SELECT
    config, framework, variant, model, dataset, device, mode, threads, epochs, iterations,
    cell_id, batch_size,
    runs, failed_runs, timeout_runs, oom_runs,
    cpu_user_median, cpu_system_median, iowait_median, cpu_total_median,
    rss_avg_mb, rss_peak_mb, device_memory_peak_mb,
    nullif(memory_limit, 0) / 1048576.0 AS memory_limit_mb,
    throughput_median
FROM s
JOIN grp USING (config)
ORDER BY framework, model, dataset, mode, config, batch_size, cell_id
