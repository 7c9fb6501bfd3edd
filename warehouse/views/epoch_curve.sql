-- One row per (sweep, cell, epoch) over the cell's ok runs: how loss, accuracy and epoch
-- time evolve epoch by epoch (median over repeats, with the spread of test accuracy).
SELECT
    o.sweep,
    o.cell_id,
    min(o.framework)                AS framework,
    min(o.model)                    AS model,
    min(o.dataset)                  AS dataset,
    min(o.threads)                  AS threads,
    min(o.batch_size)               AS batch_size,
    e.epoch,
    count(*)                        AS runs,
    median(e.train_loss)            AS train_loss_median,
    median(e.train_accuracy)        AS train_accuracy_median,
    median(e.test_accuracy)         AS test_accuracy_median,
    min(e.test_accuracy)            AS test_accuracy_min,
    max(e.test_accuracy)            AS test_accuracy_max,
    median(e.epoch_seconds)         AS epoch_seconds_median,
    median(e.test_seconds)          AS test_seconds_median
FROM epochs AS e
JOIN run_overview AS o ON o.run_id = e.run_id
WHERE o.status = 'ok'
GROUP BY o.sweep, o.cell_id, e.epoch
ORDER BY o.sweep, o.cell_id, e.epoch
