-- Language models in the statistics (issue 28): a cell's sequence length (seq_len: the
-- summary's, else the parameter's; NULL for a model of images), and its tokens_per_second and perplexity
-- (summary.tokens_per_second, summary.perplexity; docs/TRANSFORMERS.md) get a median in
-- cell_stats and a sorted list of values that a study's findings may test (metrics
-- tokens_per_second, larger is better, and perplexity, smaller is better).  The cell cache is
-- only a cache (migrations 006, 009, 010): made again with the new columns and filled by the
-- next writer, whose views' digest differs anyway.

DROP TABLE cell_cache;

CREATE TABLE cell_cache (
    cell_id VARCHAR NOT NULL, sweeps VARCHAR[], env_id VARCHAR, framework VARCHAR,
    variant VARCHAR, blas VARCHAR, device VARCHAR, mode VARCHAR, model VARCHAR, dataset VARCHAR,
    threads VARCHAR, interop_threads VARCHAR, batch_size INTEGER, epochs INTEGER,
    iterations INTEGER, optimizer VARCHAR, lr DOUBLE, onednn BOOLEAN, layout VARCHAR,
    precision VARCHAR, conv_algo VARCHAR, gpus INTEGER, nodes INTEGER, workers INTEGER,
    scaling VARCHAR, global_batch INTEGER, preset VARCHAR, cpuset VARCHAR, seed INTEGER, seq_len INTEGER,
    params JSON, runs BIGINT, failed_runs BIGINT, timeout_runs BIGINT, oom_runs BIGINT,
    diverged_runs BIGINT, mismatch_runs BIGINT, busy_set_aside BIGINT, design_level DOUBLE, train_s_n BIGINT,
    train_s_median DOUBLE, train_s_ci_low DOUBLE, train_s_ci_high DOUBLE, train_s_ci_level DOUBLE,
    train_s_cv DOUBLE,
    train_s_noisy BOOLEAN, train_s_values DOUBLE[], test_s_n BIGINT, test_s_median DOUBLE,
    test_s_ci_low DOUBLE, test_s_ci_high DOUBLE, test_s_ci_level DOUBLE, test_s_cv DOUBLE,
    test_s_noisy BOOLEAN, test_s_values DOUBLE[], accuracy_n BIGINT, accuracy_median DOUBLE,
    accuracy_ci_low DOUBLE, accuracy_ci_high DOUBLE, accuracy_ci_level DOUBLE,
    accuracy_cv DOUBLE, accuracy_noisy BOOLEAN, accuracy_values DOUBLE[], throughput_n BIGINT,
    throughput_median DOUBLE, throughput_ci_low DOUBLE, throughput_ci_high DOUBLE,
    throughput_ci_level DOUBLE, throughput_cv DOUBLE, throughput_noisy BOOLEAN,
    throughput_values DOUBLE[], epoch_s_median DOUBLE, inference_s_median DOUBLE,
    onednn_primitives DOUBLE, cpu_user_median DOUBLE, cpu_system_median DOUBLE,
    iowait_median DOUBLE, cpu_total_median DOUBLE, rss_avg_mb DOUBLE, rss_peak_mb DOUBLE,
    device_memory_peak_mb DOUBLE, exchange_s_median DOUBLE, exchange_fraction_median DOUBLE,
    tokens_per_second_median DOUBLE, perplexity_median DOUBLE,
    -- beside cell_stats: the findings' other metrics, parameters and configurations
    cpu_count INTEGER, epoch_s_values DOUBLE[], rss_peak_mb_values DOUBLE[],
    cpu_total_values DOUBLE[], device_memory_peak_mb_values DOUBLE[], tokens_per_second_values DOUBLE[],
    perplexity_values DOUBLE[], memory_limit BIGINT,
    layer_profile BOOLEAN, kvstore VARCHAR, entries STRUCT(k VARCHAR, kv VARCHAR, v VARCHAR)[],
    config_threads VARCHAR, config_batch VARCHAR, config_lr_grid VARCHAR, config_length VARCHAR,
    config_workers VARCHAR, config_library VARCHAR, config_conv_algo VARCHAR,
    config_layout VARCHAR, config_precision VARCHAR, config_onednn VARCHAR, params_key VARCHAR,
    -- epoch_convergence's rows of the cell, in epoch order (macro epoch_rows_live)
    epoch_rows STRUCT(epoch INTEGER, runs BIGINT, test_accuracy_mean DOUBLE, test_accuracy_sd DOUBLE,
        test_accuracy_min DOUBLE, test_accuracy_max DOUBLE, test_accuracy_median DOUBLE,
        test_accuracy_ci_low DOUBLE, test_accuracy_ci_high DOUBLE, test_accuracy_ci_level DOUBLE,
        train_accuracy_mean DOUBLE, train_loss_mean DOUBLE, epoch_s_median DOUBLE,
        epoch_s_ci_low DOUBLE, epoch_s_ci_high DOUBLE, elapsed_s DOUBLE)[],
    fingerprint UBIGINT NOT NULL  -- of the cell's runs (and their images' BLAS) when computed
);

DELETE FROM cache_state;

-- As in migration 006: a table that held a row binds faster in DuckLake.
INSERT INTO cell_cache (cell_id, fingerprint) VALUES ('', 0);
DELETE FROM cell_cache;
