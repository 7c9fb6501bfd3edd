-- One row per run: what was asked (params), how it ended and what it measured.
-- A parameter the cell does not have is NULL; `threads` is text (a number or "unset").
SELECT
    r.run_id,
    r.sweep,
    r.cell_id,
    r."repeat",
    r.attempt,
    r.status,
    r.exit_code,
    r.executor,
    r.env_id,
    r.params ->> 'framework'                             AS framework,
    r.params ->> 'variant'                               AS variant,
    r.params ->> 'model'                                 AS model,
    r.params ->> 'dataset'                               AS dataset,
    r.params ->> 'device'                                AS device,
    r.params ->> 'threads'                               AS threads,
    TRY_CAST(r.params ->> 'batch_size' AS INTEGER)       AS batch_size,
    TRY_CAST(r.params ->> 'epochs' AS INTEGER)           AS epochs,
    TRY_CAST(r.params ->> 'iterations' AS INTEGER)       AS iterations,
    r.params ->> 'optimizer'                             AS optimizer,
    TRY_CAST(r.params ->> 'lr' AS DOUBLE)                AS lr,
    TRY_CAST(r.params ->> 'onednn' AS BOOLEAN)           AS onednn,
    r.params ->> 'cpuset'                                AS cpuset,
    r.started_at,
    r.wall_seconds,
    r.train_seconds,
    r.test_seconds,
    r.accuracy,
    r.throughput,
    r.time_to_first_step,
    r.cpu_user_avg,
    r.cpu_system_avg,
    r.cpu_total_avg,
    r.iowait_avg,
    r.rss_avg_bytes,
    r.rss_peak_bytes,
    r.mismatches,
    r.params ->> 'mode'                                  AS mode,
    r.params ->> 'layout'                                AS layout,
    r.params ->> 'precision'                             AS precision,
    r.params ->> 'conv_algo'                             AS conv_algo,
    TRY_CAST(r.params ->> 'gpus' AS INTEGER)             AS gpus,
    r.params ->> 'interop_threads'                       AS interop_threads,
    r.params ->> 'preset'                                AS preset,
    TRY_CAST(r.params ->> 'seed' AS INTEGER)             AS seed,
    TRY_CAST(r.summary ->> 'inference_seconds' AS DOUBLE)          AS inference_seconds,
    TRY_CAST(r.summary ->> 'peak_device_memory_bytes' AS BIGINT)   AS peak_device_memory_bytes,
    TRY_CAST(r.probe ->> 'onednn_primitives' AS BIGINT)            AS onednn_primitives,
    -- early stopping (the harness's summary; NULL for inference and runs of older harnesses)
    TRY_CAST(r.summary ->> 'epochs_run' AS INTEGER)                AS epochs_run,
    TRY_CAST(r.summary ->> 'stopped_early' AS BOOLEAN)             AS stopped_early,
    TRY_CAST(r.summary ->> 'best_epoch' AS INTEGER)                AS best_epoch,
    -- GPU telemetry, energy and machine state (migration 007; NULL where unmeasured).  The
    -- energy is the whole run's (start-up and evaluation included) over the images of all its
    -- training steps (summary.images): joules per image, NULL where either is missing.
    r.gpu_util_avg,
    r.gpu_mem_used_peak_bytes,
    r.gpu_power_avg_w,
    r.gpu_energy_j,
    r.cpu_energy_j,
    TRY_CAST(r.summary ->> 'images' AS BIGINT)                     AS images,
    r.gpu_energy_j / NULLIF(TRY_CAST(r.summary ->> 'images' AS BIGINT), 0)      AS gpu_j_per_image,
    r.cpu_energy_j / NULLIF(TRY_CAST(r.summary ->> 'images' AS BIGINT), 0)      AS cpu_j_per_image,
    CASE WHEN r.gpu_energy_j IS NOT NULL OR r.cpu_energy_j IS NOT NULL
         THEN (coalesce(r.gpu_energy_j, 0) + coalesce(r.cpu_energy_j, 0))
              / NULLIF(TRY_CAST(r.summary ->> 'images' AS BIGINT), 0) END    AS j_per_image,
    r.gpu_throttled,
    TRY_CAST(r.monitor -> 'gpu_throttle_reasons' AS VARCHAR[])     AS gpu_throttle_reasons,
    r.busy_start,
    TRY_CAST(r.host -> 'state' -> 'busy_reasons' AS VARCHAR[])     AS busy_reasons,
    -- transformers and compilation (docs/TRANSFORMERS.md): NULL for the CNNs and eager runs.
    -- A language model's throughput is sequences/s; tokens/s is that × seq_len.
    r.params ->> 'compile'                                         AS compile,
    r.params ->> 'attention'                                       AS attention,
    TRY_CAST(r.summary ->> 'seq_len' AS INTEGER)                   AS seq_len,
    TRY_CAST(r.summary ->> 'tokens_per_second' AS DOUBLE)          AS tokens_per_second,
    TRY_CAST(r.summary ->> 'test_loss' AS DOUBLE)                  AS test_loss,
    TRY_CAST(r.summary ->> 'perplexity' AS DOUBLE)                 AS perplexity,
    TRY_CAST(r.summary -> 'compilation' ->> 'seconds' AS DOUBLE)   AS compile_seconds,
    -- compilations the framework reported while a timed step ran (0: none; NULL: not watched)
    TRY_CAST(r.summary -> 'compilation' ->> 'in_steps' AS INTEGER) AS compiles_in_steps,
    -- PyTorch: whether Inductor's on-disk cache held the compiled graphs (warm / cold / partly warm)
    r.summary -> 'compilation' -> 'cache' ->> 'state'              AS compile_cache,
    r.probe -> 'in_force' ->> 'attention_kernel'                   AS attention_kernel
FROM runs AS r
WHERE r."repeat" <> canary_repeat()  -- canary runs ([sweep] canary) are no repeats
ORDER BY r.sweep, r.cell_id, r."repeat", r.attempt
