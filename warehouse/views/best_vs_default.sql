-- How much faster than its defaults can each framework train without losing accuracy?
-- (STUDIES.md A: "the best settings for one framework are not the best for another".)
-- One row per (framework, model, dataset, device) with training cells.  The default cell
-- is the one default_cells names (NULL when absent or ambiguous: then best is NULL too).
-- Candidates: the group's cells with ok runs, no diverged run, a throughput, and a median
-- accuracy at least the default's median minus 0.5 percentage points (0.005) and, for a language
-- model, the default's sequence length (so that sequences/s compare as tokens/s do).  best: the
-- candidate with the highest median throughput (ties: the default, then the lower median
-- train s, then the cell id); it may be the default itself.  changes lists the parameters (key=value) of the best cell
-- that differ from the default's.  speedup = best throughput / default throughput,
-- time_speedup = default train s / best train s, accuracy_change in percentage points.
-- p_value, test, significant: two-sided Mann-Whitney on the runs' throughput, best against
-- default (macro compare_samples); verdict 'faster' only when significant; 'within 5 %' when
-- not, but the speedup's Hodges-Lehmann interval lies inside [1/1.05, 1.05] (the defaults are
-- as fast as the best found, to 5 %: decided, an equivalence by interval); 'not significant'
-- otherwise (undecided: more runs would tell); 'default is fastest' when the best is the default.
-- speedup_low / _high / _level: the Hodges-Lehmann interval of speedup and its coverage
-- (compare_samples' ratio fields; docs/WAREHOUSE.md "Statistics"), NULL when the best is the
-- default.
WITH cs AS (
    SELECT * FROM cell_cache
),
d AS (
    SELECT framework, model, dataset, device, cell_id AS default_cell_id, note AS default_note
    FROM default_cells WHERE mode = 'train'
),
g AS (
    SELECT d.*, dc.accuracy_median AS default_accuracy, dc.params_key AS default_params_key,
        dc.seq_len AS default_seq_len
    FROM d LEFT JOIN cs AS dc ON dc.cell_id = d.default_cell_id
),
cand AS (
    SELECT g.framework, g.model, g.dataset, g.device,
        count(*) AS candidates,
        first(c.cell_id ORDER BY c.throughput_median DESC, c.cell_id = g.default_cell_id DESC,
                    c.train_s_median ASC NULLS LAST, c.cell_id)
            AS best_cell_id
    FROM g
    JOIN cs AS c
      ON c.framework = g.framework AND c.model = g.model AND c.dataset = g.dataset
     AND c.device = g.device AND c.mode = 'train'
    WHERE c.runs > 0 AND c.diverged_runs = 0 AND c.throughput_median IS NOT NULL
      AND c.accuracy_median >= g.default_accuracy - 0.005
      AND c.seq_len IS NOT DISTINCT FROM g.default_seq_len
    GROUP BY ALL
),
pairs AS (
    SELECT g.*, coalesce(cand.candidates, 0) AS candidates, cand.best_cell_id,
        dc.runs AS default_runs, b.runs AS best_runs,
        dc.throughput_median AS default_throughput, b.throughput_median AS best_throughput,
        dc.train_s_median AS default_train_s, b.train_s_median AS best_train_s,
        b.accuracy_median AS best_accuracy,
        list_filter(string_split(b.params_key, ';'),
            lambda kv: NOT list_contains(string_split(g.default_params_key, ';'), kv)) AS changes,
        compare_samples(b.throughput_values, dc.throughput_values, level := least(b.design_level, dc.design_level)) AS tcmp,
        compare_samples(b.accuracy_values, dc.accuracy_values, level := least(b.design_level, dc.design_level)) AS acmp
    FROM g
    LEFT JOIN cand USING (framework, model, dataset, device)
    LEFT JOIN cs AS dc ON dc.cell_id = g.default_cell_id
    LEFT JOIN cs AS b ON b.cell_id = cand.best_cell_id
)
SELECT
    framework, model, dataset, device,
    default_cell_id, default_note, candidates, best_cell_id,
    CASE WHEN best_cell_id IS NOT NULL THEN changes END    AS changes,
    default_runs, best_runs,
    default_throughput, best_throughput,
    best_throughput / default_throughput                   AS speedup,
    CASE WHEN best_cell_id <> default_cell_id THEN tcmp.ratio_low END     AS speedup_low,
    CASE WHEN best_cell_id <> default_cell_id THEN tcmp.ratio_high END    AS speedup_high,
    CASE WHEN best_cell_id <> default_cell_id THEN tcmp.ratio_level END   AS speedup_level,
    default_train_s, best_train_s,
    default_train_s / best_train_s                         AS time_speedup,
    default_accuracy, best_accuracy,
    (best_accuracy - default_accuracy) * 100               AS accuracy_change,
    CASE WHEN best_cell_id <> default_cell_id THEN tcmp.p_value END       AS p_value,
    CASE WHEN best_cell_id <> default_cell_id THEN tcmp.test END          AS test,
    CASE WHEN best_cell_id = default_cell_id THEN false ELSE tcmp.significant END AS significant,
    CASE WHEN best_cell_id = default_cell_id THEN 'default is fastest'
         WHEN NOT tcmp.significant AND tcmp.ratio_low >= 1 / 1.05 AND tcmp.ratio_high <= 1.05
              THEN 'within 5 %'
         ELSE verdict(tcmp, true, 'faster', 'slower') END  AS verdict,
    CASE WHEN best_cell_id <> default_cell_id THEN acmp.p_value END       AS accuracy_p_value,
    CASE WHEN best_cell_id <> default_cell_id
         THEN verdict(acmp, true, 'more accurate', 'less accurate') END   AS accuracy_verdict
FROM pairs
ORDER BY framework, model, dataset, device
