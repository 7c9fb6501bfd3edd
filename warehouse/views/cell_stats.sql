-- How fast, how accurate and how repeatable is each cell?  One row per cell (cell_id, over
-- every sweep that ran it): its parameters, its outcome counts, and, over its ok runs, for
-- train_seconds (train_s), test_seconds (test_s), accuracy and throughput: n, median, the
-- exact 95 % confidence interval of the median (order statistics, macro median_ci: for
-- n <= 5 the full range [min, max] with its lower coverage in *_ci_level; NULL for n = 1),
-- coefficient of variation (stddev_samp / mean) and noisy (CV > 0.05; NULL below 2 runs),
-- plus the sorted values the comparison views test; for a language model (docs/TRANSFORMERS.md)
-- tokens_per_second_median (throughput x seq_len) and perplexity_median (exp of the test loss),
-- NULL for every other cell.  Throughput is the harness's median
-- images/s over the timed steps: warm-up steps are already left out.  A diverged run
-- (NaN loss) stopped early: its train and test times are left out (its accuracy is NULL,
-- its throughput counts); diverged_runs counts it.  workers is the cell's data-parallel
-- world (max(params.workers, gpus) x nodes), global_batch the samples of one optimizer step
-- (batch_size x workers x nodes with scaling = 'weak', else batch_size), exchange_s_median /
-- exchange_fraction_median rank 0's gradient-exchange seconds per step and their share of the
-- step, where the framework exposes them (summary.exchange; docs/HARNESS.md).  STUDIES.md A1
-- (Tables VI-VII) is this view at the framework-default cells; the sweep views build on it.
-- Computed in views/cell_facts.sql, which keeps them in a cache (docs/WAREHOUSE.md "Views at
-- scale").
SELECT * EXCLUDE (cpu_count, epoch_s_values, rss_peak_mb_values, cpu_total_values,
                  device_memory_peak_mb_values, tokens_per_second_values, perplexity_values, memory_limit, layer_profile, kvstore, entries,
                  config_threads, config_batch, config_lr_grid, config_length, config_workers,
                  config_library, config_conv_algo, config_layout, config_precision, config_onednn,
                  params_key, epoch_rows, fingerprint)
FROM cell_facts
ORDER BY framework, model, dataset, cell_id
