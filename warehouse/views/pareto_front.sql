-- Which cells are the best trade-offs between training time and accuracy?  One row per
-- training cell with a median train time and a median accuracy over its ok runs, grouped
-- by (model, dataset, device) across frameworks.  A cell is dominated when another cell of
-- the group has a median train time no higher and a median accuracy no lower, one of them
-- strictly; on_front: dominated by none (dominated_by: by how many); on_framework_front:
-- the same within the cell's framework.  Medians only, no test: two cells whose
-- intervals overlap may swap places with more repeats (see the *_ci_* columns).
WITH s AS (
    SELECT * FROM cell_cache
    WHERE mode = 'train' AND train_s_median IS NOT NULL AND accuracy_median IS NOT NULL
),
-- dominated_by = #{b : t_b <= t_a and acc_b >= acc_a} - #{b : t_b = t_a and acc_b = acc_a}
-- (a itself among both): a framed rank by accuracy over the cells no slower than a counts the
-- first in n log n (a self-join was quadratic in the group's cells: seconds at 15,000 cells).
d AS (
    SELECT cell_id,
        count(*) OVER g - rank(ORDER BY accuracy_median) OVER g + 1
            - count(*) OVER (PARTITION BY model, dataset, device, train_s_median, accuracy_median)
            AS dominated_by,
        count(*) OVER f - rank(ORDER BY accuracy_median) OVER f + 1
            - count(*) OVER (PARTITION BY model, dataset, device, framework, train_s_median, accuracy_median)
            = 0 AS on_framework_front
    FROM s
    WINDOW g AS (PARTITION BY model, dataset, device ORDER BY train_s_median
                 RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
           f AS (PARTITION BY model, dataset, device, framework ORDER BY train_s_median
                 RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT
    s.model, s.dataset, s.device, s.framework, s.cell_id,
    s.variant, s.threads, s.batch_size, s.epochs, s.iterations, s.optimizer, s.lr, s.onednn,
    s.layout, s.precision, s.runs,
    s.train_s_median, s.train_s_ci_low, s.train_s_ci_high,
    s.accuracy_median, s.accuracy_ci_low, s.accuracy_ci_high,
    d.dominated_by,
    d.dominated_by = 0                  AS on_front,
    d.on_framework_front
FROM s JOIN d USING (cell_id)
ORDER BY s.model, s.dataset, s.device, s.train_s_median, s.accuracy_median DESC, s.cell_id
