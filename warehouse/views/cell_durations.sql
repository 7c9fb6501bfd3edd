-- One row per cell that has succeeded at least once: the median wall time of its ok runs
-- (used to estimate how long the rest of a sweep will take).
SELECT
    cell_id,
    count(*)                        AS runs,
    median(wall_seconds)            AS wall_seconds_median
FROM runs
WHERE status = 'ok'
GROUP BY cell_id
ORDER BY cell_id
