-- How do test accuracy and time evolve epoch by epoch, and how much do repeats differ?
-- (STUDIES.md B7 Fig 8: accuracy per epoch over 5 repeats, time per epoch.)  One row per
-- (cell, epoch) over the cell's ok runs in every sweep: test accuracy mean, sample
-- standard deviation, min, max, median and the exact confidence interval of the median
-- (macro median_ci: [min, max] with its coverage below 6 runs, NULL for one run); train
-- accuracy and loss means; the median epoch time with its interval, and elapsed_s, the
-- running sum of the median epoch times up to this epoch (the x axis of accuracy over time).
WITH e AS (
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
    JOIN runs AS r USING (run_id)
    WHERE r.status = 'ok'
    GROUP BY r.cell_id, e.epoch
)
SELECT
    e.cell_id, c.framework, c.variant, c.model, c.dataset, c.device, c.threads, c.batch_size,
    c.optimizer, c.lr,
    e.epoch, e.runs,
    e.test_accuracy_mean, e.test_accuracy_sd, e.test_accuracy_min, e.test_accuracy_max,
    e.test_accuracy_median,
    e.acc_ci.low AS test_accuracy_ci_low, e.acc_ci.high AS test_accuracy_ci_high,
    e.acc_ci.level AS test_accuracy_ci_level,
    e.train_accuracy_mean, e.train_loss_mean,
    e.epoch_s_median, e.time_ci.low AS epoch_s_ci_low, e.time_ci.high AS epoch_s_ci_high,
    sum(e.epoch_s_median) OVER (PARTITION BY e.cell_id ORDER BY e.epoch) AS elapsed_s
FROM e
JOIN cell_stats AS c USING (cell_id)
ORDER BY c.framework, c.model, c.dataset, e.cell_id, e.epoch
