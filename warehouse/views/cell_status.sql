-- One row per (cell, repeat): how many attempts ran, how the latest ended, and whether any
-- attempt succeeded.  A sweep uses it to decide which cells still need to run.
SELECT
    cell_id,
    "repeat",
    count(*)                        AS attempts,
    max(attempt)                    AS max_attempt,
    arg_max(status, attempt)        AS last_status,
    bool_or(status = 'ok')          AS ok
FROM runs
GROUP BY cell_id, "repeat"
ORDER BY cell_id, "repeat"
