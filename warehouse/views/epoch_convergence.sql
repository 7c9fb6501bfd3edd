-- How do test accuracy and time evolve epoch by epoch, and how much do repeats differ?
-- (STUDIES.md B7 Fig 8: accuracy per epoch over 5 repeats, time per epoch.)  One row per
-- (cell, epoch) over the cell's ok runs in every sweep: test accuracy mean, sample
-- standard deviation, min, max, median and the exact confidence interval of the median
-- (macro median_ci: [min, max] with its coverage below 6 runs, NULL for one run); train
-- accuracy and loss means; the median epoch time with its interval, and elapsed_s, the
-- running sum of the median epoch times up to this epoch (the x axis of accuracy over time).
-- The rows are computed per cell in views/cell_facts.sql (epoch_rows), which keeps them in a
-- cache (docs/WAREHOUSE.md "Views at scale").
WITH c AS (
    SELECT * FROM cell_cache
),
e AS (
    SELECT c.cell_id, unnest(c.epoch_rows, recursive := true) FROM c
)
SELECT
    e.cell_id, c.framework, c.variant, c.model, c.dataset, c.device, c.threads, c.batch_size,
    c.optimizer, c.lr,
    e.epoch, e.runs,
    e.test_accuracy_mean, e.test_accuracy_sd, e.test_accuracy_min, e.test_accuracy_max,
    e.test_accuracy_median,
    e.test_accuracy_ci_low, e.test_accuracy_ci_high, e.test_accuracy_ci_level,
    e.train_accuracy_mean, e.train_loss_mean,
    e.epoch_s_median, e.epoch_s_ci_low, e.epoch_s_ci_high,
    e.elapsed_s
FROM e
JOIN c USING (cell_id)
ORDER BY c.framework, c.model, c.dataset, e.cell_id, e.epoch
