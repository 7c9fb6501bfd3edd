-- Which kinds of layer take the time of a training step: how much goes to the
-- convolutions, how much to the rest?  (STUDIES.md D Figs 6-7: convolutions up to 83 %;
-- E Fig 7.)  One row per (sweep, cell, layer kind), summed over the layers of that kind
-- from the per-layer medians: forward_s, backward_s, total_s, share of the cell's summed
-- layer time, backward_ratio = backward_s / forward_s, params and flops per sample.
SELECT
    sweep, cell_id,
    any_value(framework)                                AS framework,
    any_value(model)                                    AS model,
    any_value(batch_size)                               AS batch_size,
    kind,
    count(*)                                            AS layers,
    sum(forward_s_median)                               AS forward_s,
    sum(backward_s_median)                              AS backward_s,
    sum(total_s_median)                                 AS total_s,
    sum(share)                                          AS share,
    sum(backward_s_median) / nullif(sum(forward_s_median), 0) AS backward_ratio,
    sum(params)                                         AS params,
    sum(flops)                                          AS flops
FROM layer_breakdown
GROUP BY sweep, cell_id, kind
ORDER BY sweep, cell_id, total_s DESC, kind
