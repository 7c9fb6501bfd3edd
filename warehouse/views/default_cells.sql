-- Which cell ran each framework with its own default settings, and how did it do?
-- (STUDIES.md A1, Tables VI-VII: train s, test s, accuracy per framework x device x
-- dataset.)  One row per (framework, model, dataset, device, mode) that has a cell with ok
-- runs.  The default cell is chosen in three steps:
--   1. default execution settings: threads and interop_threads "unset", onednn true (null: a
--      framework without oneDNN, framework.toml onednn = false), the
--      framework's own layout (none for a transformer, macro transformer_model) and
--      convolution-algorithm choice (macros framework_default_layout /
--      framework_default_conv_algo), compile and attention "default", precision fp32, variant
--      "cpu" on the CPU (any variant on the GPU), one worker, no cpuset, no memory limit, no
--      layer profile, preset "framework-default" or "none";
--   2. of those, preset "framework-default" wins over "none";
--   3. of those, the cells whose optimizer, lr and batch_size are the preset's own
--      (macro default_hyperparams; NULL ones, as in inference, count as matching) win, if
--      any does.
-- Exactly one cell left: it is the default (note 'default').  None: cell_id NULL, note
-- 'no cell with the framework's default settings'.  Several (they differ in epochs,
-- iterations, seed, momentum...): cell_id NULL, note 'ambiguous: N cells ...' - a default
-- is never guessed.  The training length (epochs / iterations) is the study's choice and
-- is not part of the rule.
WITH s AS (
    SELECT *,
        threads = 'unset' AND interop_threads = 'unset' AND coalesce(onednn, true)
        AND (layout = framework_default_layout(framework) OR (layout IS NULL AND transformer_model(model)))
        AND coalesce(params ->> 'compile', 'default') = 'default'
        AND coalesce(params ->> 'attention', 'default') = 'default'
        AND precision = 'fp32'
        AND conv_algo = framework_default_conv_algo(framework, device)
        AND (device <> 'cpu' OR variant = 'cpu')
        AND workers = 1
        AND coalesce(cpuset, '') = ''
        AND coalesce(memory_limit, 0) = 0
        AND NOT coalesce(layer_profile, false) AS default_settings
    FROM cell_cache
    WHERE runs > 0
),
ranked AS (
    SELECT *,
        CASE preset WHEN 'framework-default' THEN 0 ELSE 2 END
        + CASE WHEN (optimizer IS NULL OR optimizer = hp.optimizer)
                AND (lr IS NULL OR lr = hp.lr)
                AND (batch_size IS NULL OR batch_size = hp.batch_size) THEN 0 ELSE 1 END AS pref
    FROM (SELECT *, default_hyperparams(framework, dataset, preset) AS hp FROM s)
    WHERE default_settings AND preset IN ('framework-default', 'none')
),
candidates AS (
    SELECT *, min(pref) OVER (PARTITION BY framework, model, dataset, device, mode) AS best_pref
    FROM ranked
),
chosen AS (
    SELECT framework, model, dataset, device, mode,
        count(*) AS candidates,
        CASE WHEN count(*) = 1 THEN any_value(cell_id) END AS cell_id
    FROM candidates
    WHERE pref = best_pref
    GROUP BY ALL
),
groups AS (
    SELECT DISTINCT framework, model, dataset, device, mode FROM s
)
SELECT
    g.framework, g.model, g.dataset, g.device, g.mode,
    c.cell_id,
    coalesce(c.candidates, 0)                        AS candidates,
    CASE WHEN c.cell_id IS NOT NULL THEN 'default'
         WHEN c.candidates IS NULL THEN 'no cell with the framework''s default settings'
         ELSE 'ambiguous: ' || c.candidates || ' cells with default settings differ in other parameters'
    END                                              AS note,
    d.preset, d.threads, d.batch_size, d.epochs, d.optimizer, d.lr,
    d.runs,
    d.train_s_median, d.train_s_ci_low, d.train_s_ci_high,
    d.test_s_median,
    d.accuracy_median, d.accuracy_ci_low, d.accuracy_ci_high,
    d.throughput_median, d.throughput_ci_low, d.throughput_ci_high
FROM groups AS g
LEFT JOIN chosen AS c USING (framework, model, dataset, device, mode)
LEFT JOIN s AS d ON d.cell_id = c.cell_id
ORDER BY g.framework, g.model, g.dataset, g.device, g.mode
