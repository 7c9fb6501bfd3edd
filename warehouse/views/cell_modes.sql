-- Do a cell's repeats fall into two modes?  One row per cell with ok runs (over every sweep,
-- canary runs left out): over their throughputs, macro two_modes' verdict (docs/WAREHOUSE.md
-- "Bimodal cells": split at the largest gap leaving two runs or more on each side; bimodal
-- when the gap is more than 3 times the wider side's range and more than 10 % of the median).
-- bimodal is NULL below four ok runs.  For a bimodal cell, the slow mode (the lower
-- throughputs) and the fast mode: their runs and median throughput, and their ratio; the
-- cell's one median (the cell statistics') then lies in neither mode, or in one by the count of runs.
-- gap and spread (the wider side's range) are given for every cell with four runs or more.
WITH ok AS (
    SELECT
        cell_id,
        any_value(params ->> 'framework')                       AS framework,
        any_value(params ->> 'variant')                         AS variant,
        any_value(params ->> 'model')                           AS model,
        any_value(params ->> 'dataset')                         AS dataset,
        any_value(params ->> 'device')                          AS device,
        count(throughput)                                       AS runs,
        median(throughput)                                      AS throughput_median,
        two_modes(list(throughput))                             AS m
    FROM runs
    WHERE status = 'ok' AND "repeat" <> canary_repeat()
    GROUP BY cell_id
)
SELECT
    cell_id, framework, variant, model, dataset, device, runs, throughput_median,
    m.bimodal                                                    AS bimodal,
    CASE WHEN m.bimodal THEN m.low_n END                         AS slow_runs,
    CASE WHEN m.bimodal THEN m.low_median END                    AS slow_throughput_median,
    CASE WHEN m.bimodal THEN m.high_n END                        AS fast_runs,
    CASE WHEN m.bimodal THEN m.high_median END                   AS fast_throughput_median,
    CASE WHEN m.bimodal THEN m.high_median / NULLIF(m.low_median, 0) END AS fast_over_slow,
    m.gap                                                        AS gap,
    m.spread                                                     AS spread
FROM ok
ORDER BY framework, model, dataset, cell_id
