-- Where does the time of one training step go, layer by layer?  (STUDIES.md D Figs 6-7,
-- E Fig 7.)  Median over a cell's ok runs of each layer's forward and backward time, and
-- each layer's share of the summed layer time of its cell.
WITH per_cell AS (
    SELECT
        r.sweep, r.cell_id,
        any_value(json_extract_string(r.params, '$.framework')) AS framework,
        any_value(json_extract_string(r.params, '$.model'))     AS model,
        any_value(CAST(json_extract(r.params, '$.batch_size') AS INTEGER)) AS batch_size,
        l.name, any_value(l.kind) AS kind, min(l."index") AS layer_index,
        count(*)                    AS runs,
        median(l.forward_seconds)   AS forward_s_median,
        median(l.backward_seconds)  AS backward_s_median,
        any_value(l.params)         AS params,
        any_value(l.flops)          AS flops
    FROM layers l JOIN runs r USING (run_id)
    WHERE r.status = 'ok' AND r."repeat" <> canary_repeat()
    GROUP BY r.sweep, r.cell_id, l.name
)
SELECT
    sweep, cell_id, framework, model, batch_size, layer_index, name, kind, runs,
    forward_s_median, backward_s_median,
    coalesce(forward_s_median, 0) + coalesce(backward_s_median, 0) AS total_s_median,
    (coalesce(forward_s_median, 0) + coalesce(backward_s_median, 0))
        / nullif(sum(coalesce(forward_s_median, 0) + coalesce(backward_s_median, 0))
                 OVER (PARTITION BY sweep, cell_id), 0) AS share,
    params, flops
FROM per_cell
ORDER BY sweep, cell_id, layer_index
