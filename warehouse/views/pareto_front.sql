-- Which cells are the best trade-offs between training time and accuracy?  One row per
-- training cell with a median train time and a median accuracy over its ok runs, grouped
-- by (model, dataset, device) across frameworks.  A cell is dominated when another cell of
-- the group has a median train time no higher and a median accuracy no lower, one of them
-- strictly; on_front: dominated by none (dominated_by: by how many); on_framework_front:
-- the same within the cell's framework.  Medians only, no test: two cells whose
-- intervals overlap may swap places with more repeats (see the *_ci_* columns).
WITH s AS (
    SELECT * FROM cell_stats
    WHERE mode = 'train' AND train_s_median IS NOT NULL AND accuracy_median IS NOT NULL
),
d AS (
    SELECT a.cell_id,
        count(b.cell_id)                                        AS dominated_by,
        count(b.cell_id) FILTER (WHERE b.framework = a.framework) AS dominated_in_framework
    FROM s AS a
    LEFT JOIN s AS b
      ON b.model = a.model AND b.dataset = a.dataset AND b.device = a.device
     AND b.cell_id <> a.cell_id
     AND b.train_s_median <= a.train_s_median AND b.accuracy_median >= a.accuracy_median
     AND (b.train_s_median < a.train_s_median OR b.accuracy_median > a.accuracy_median)
    GROUP BY a.cell_id
)
SELECT
    s.model, s.dataset, s.device, s.framework, s.cell_id,
    s.variant, s.threads, s.batch_size, s.epochs, s.iterations, s.optimizer, s.lr, s.onednn,
    s.layout, s.precision, s.runs,
    s.train_s_median, s.train_s_ci_low, s.train_s_ci_high,
    s.accuracy_median, s.accuracy_ci_low, s.accuracy_ci_high,
    d.dominated_by,
    d.dominated_by = 0                  AS on_front,
    d.dominated_in_framework = 0        AS on_framework_front
FROM s JOIN d USING (cell_id)
ORDER BY s.model, s.dataset, s.device, s.train_s_median, s.accuracy_median DESC, s.cell_id
