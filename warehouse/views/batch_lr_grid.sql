-- Which combinations of batch size, training length and learning rate train well, and
-- which diverge?  (STUDIES.md A9-A10, Tables XIX-XXI, Fig 5.)  One row per cell whose
-- configuration (every parameter but batch_size, epochs, iterations and lr, same
-- environment) has two or more cells.  diverged: some ok run reported a diverged (NaN or
-- infinite) loss; its accuracy is NULL when the run recorded none, so accuracy_median is
-- over the runs that have one (accuracy_n of them) and NULL when none has.  best_accuracy
-- marks the highest median accuracy of the configuration among cells without divergence.
WITH s AS (
    SELECT *, config_lr_grid AS config FROM cell_cache
),
grp AS (
    SELECT config FROM s GROUP BY config HAVING count(*) >= 2
),
g AS (
    SELECT s.*,
        diverged_runs > 0 AS diverged,
        max(accuracy_median) FILTER (WHERE diverged_runs = 0) OVER (PARTITION BY config) AS top
    FROM s JOIN grp USING (config)
)
SELECT
    config, framework, variant, model, dataset, device, threads, optimizer,
    cell_id, batch_size, epochs, iterations, lr,
    runs, failed_runs, diverged_runs, diverged,
    accuracy_n, accuracy_median, accuracy_ci_low, accuracy_ci_high,
    train_s_median, epoch_s_median, throughput_median,
    coalesce(NOT diverged AND accuracy_median = top, false) AS best_accuracy
FROM g
ORDER BY framework, model, dataset, config, batch_size, iterations, epochs, lr, cell_id
