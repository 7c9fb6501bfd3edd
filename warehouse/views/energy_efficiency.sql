-- Energy per image beside throughput, per cell over its ok runs (issue 15).  Energy is the
-- whole run's as the host measured it — NVML's energy counter of the cell's GPUs (or their
-- power integrated where a GPU has no counter: `gpu_energy_source`) and RAPL's CPU packages
-- (the whole host's packages, not the cell's share) — over the images of all the run's
-- training steps.  NULL, never 0, where a run measured nothing: a CPU cell on a host without
-- readable RAPL counters has energy_runs = 0.
SELECT
    o.sweep,
    o.cell_id,
    min(o.framework)                                 AS framework,
    min(o.variant)                                   AS variant,
    min(o.model)                                     AS model,
    min(o.dataset)                                   AS dataset,
    min(o.device)                                    AS device,
    min(o.threads)                                   AS threads,
    min(o.batch_size)                                AS batch_size,
    min(o.precision)                                 AS precision,
    min(o.gpus)                                      AS gpus,
    count(*)                                         AS runs,
    count(o.j_per_image)                             AS energy_runs,
    median(o.throughput)                             AS throughput_median,
    median(o.gpu_energy_j)                           AS gpu_energy_j_median,
    median(o.cpu_energy_j)                           AS cpu_energy_j_median,
    median(o.gpu_j_per_image)                        AS gpu_j_per_image,
    median(o.cpu_j_per_image)                        AS cpu_j_per_image,
    median(o.j_per_image)                            AS j_per_image,
    1.0 / NULLIF(median(o.j_per_image), 0)           AS images_per_joule,
    median(o.gpu_power_avg_w)                        AS gpu_power_w_median,
    any_value(r.monitor ->> 'gpu_energy_source')     AS gpu_energy_source,
    any_value(r.monitor ->> 'cpu_energy_source')     AS cpu_energy_source,
    count(*) FILTER (WHERE o.gpu_throttled)          AS throttled_runs
FROM run_overview AS o
JOIN runs AS r USING (run_id)
WHERE o.status = 'ok'
GROUP BY o.sweep, o.cell_id
ORDER BY o.sweep, framework, model, dataset, device, batch_size, cell_id
