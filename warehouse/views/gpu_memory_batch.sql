-- Device memory against batch size (study B1's question), per GPU cell over its ok runs: what
-- NVML saw the GPU use at its peak (the whole process: context, allocator pools, workspaces)
-- beside the framework allocator's own peak (summary.peak_device_memory_bytes), in MiB, with
-- the GPU's total memory from the run's host facts.  Ordered so each (framework, model,
-- precision, layout) series reads down by batch size.
SELECT
    o.sweep,
    min(o.framework)                                 AS framework,
    min(o.variant)                                   AS variant,
    min(o.model)                                     AS model,
    min(o.dataset)                                   AS dataset,
    min(o.precision)                                 AS precision,
    min(o.layout)                                    AS layout,
    min(o.gpus)                                      AS gpus,
    o.batch_size,
    o.cell_id,
    count(*)                                         AS runs,
    median(o.gpu_mem_used_peak_bytes) / 1048576.0    AS nvml_peak_mb,
    median(o.peak_device_memory_bytes) / 1048576.0   AS allocator_peak_mb,
    max(TRY_CAST(r.host -> 'gpu' -> 'gpus' -> 0 ->> 'memory_total_bytes' AS BIGINT)) / 1048576.0
                                                     AS gpu_total_mb,
    any_value(r.host -> 'gpu' -> 'gpus' -> 0 ->> 'name') AS gpu_name,
    count(*) FILTER (WHERE o.gpu_throttled)          AS throttled_runs
FROM run_overview AS o
JOIN runs AS r USING (run_id)
WHERE o.status = 'ok' AND o.device = 'gpu'
GROUP BY o.sweep, o.cell_id, o.batch_size
ORDER BY o.sweep, framework, model, precision, layout, o.batch_size, o.cell_id
