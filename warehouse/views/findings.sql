-- Did this host reproduce what each study's paper reported?  (docs/WAREHOUSE.md, "Studies
-- and findings".)  One row per (study, finding, configuration the data cover): the finding's
-- check (study_findings.check_kind, its keys in options) over the study's cells (study_cells,
-- every profile) with ok runs.  A configuration is config_id(params, [x] + along, env_id):
-- every parameter but the check's x (and the parameters declared to vary along with it), the
-- environment ignored when x or along names variant or framework (they change it).  One
-- cell per value of x (the one with the most values of the metric).  largest_share works per
-- cell (config_id(params, [], env_id)) from the layer profiles of its ok runs.
--
-- verdict: 'reproduced' / 'contradicted' / 'not significant' / 'not enough data'.  The test is
-- compare_samples (two-sided Mann-Whitney on the runs' values of the metric, never calling an
-- interval overlap significant) of cell_id's runs against ref_cell_id's; only a significant
-- difference is reproduced or contradicted, except `bounded` (equivalence, decided with an
-- interval rather than a large p: reproduced when every comparison's interval lies inside the
-- bound; a change beyond it is contradicted only when significant) and `largest_share` (a
-- count over runs, no test).  The rules, with a the cell
-- under test and b its reference, r = median(a) / median(b), significant = cmp.significant,
-- worse / better by the metric (throughput, accuracy and tokens_per_second larger is better, the rest smaller;
-- share:<kind>, a layer kind's share of each ok run's layer-profile time, counts as smaller-is-better):
--   proportional     a = largest x > 0, b = smallest: a larger and |r / (x_a / x_b) - 1| <= tolerance
--   trend            a = largest numeric x, b = smallest: the change in the expected direction
--   oversubscription a = largest x above the host's CPU count (largest runs.host cpu_count of
--                    the configuration), b = the best cell with x <= it: a worse
--   spread           a = worst median, b = best: a worse and max(r, 1/r) >= at_least
--   bounded          b = the ref value of x (default: the parameter's default), else the
--                    smallest; against it every other value a: reproduced when, for every a,
--                    the median is within at_most and the Hodges-Lehmann interval of the
--                    change is a 95 % one (level >= 0.95) inside the bound: for accuracy the
--                    difference a - b in percentage points (shift_ci) within ± at_most, else
--                    the ratio a / b (compare_samples' ratio_low / ratio_high) within
--                    1 ± at_most.  A median beyond the bound and significant: contradicted.
--                    Anything else is undecided, 'not significant', and observed says why
--                    ('interval 0.91–1.09 reaches beyond ±5.00 %: more runs needed'; no
--                    interval with 1 run against 1 or a value <= 0; below 95 % with fewer
--                    than 4 runs against 4).  The row shows the deciding comparison: a
--                    contradicting one, else an undecided one (medians beyond the bound
--                    first), else the largest change
--   option           a = x = value, b = x = ref: the change in the expected direction
--                    ('differs': either), and with `about` | |r - 1| - about | <= tolerance
--   largest_share    the kind's summed forward + backward time is the largest kind's in every
--                    ok run with a layer profile (at least 3): reproduced; in none: contradicted
--   sublinear        a = largest x > 0, b = smallest: a better and speedup / (x_a / x_b) < 1
-- A finding with no row (its study has no ok runs yet, no layer profile, ...) gets one row
-- 'not enough data' with NULL config.  config_label names the configuration in words (below,
-- `labels`): the report's "configuration" column, the same text in every export.  effect: r (proportional and sublinear: r over the x
-- ratio, i.e. linearity and efficiency; spread: max(r, 1/r); bounded: the largest change, in
-- percentage points for accuracy; largest_share: the kind's median share).  ratio = median a /
-- median b of the compared cells (pair and bounded checks), ratio_low / ratio_high / ratio_level
-- its Hodges-Lehmann interval (compare_samples), shown in observed as '0.60× (0.59–0.62)'
-- (fmt_cmp_ratio; spread and sublinear as the ratio they show, inverted where it is; bounded
-- accuracy as the difference with its interval, '-0.25 pp (-0.90 to +0.40)', fmt_pp_ci).
-- test: compare_samples' test, or for a bounded row decided by its intervals the interval
-- check in words with its level ('Hodges–Lehmann 97 % interval of the ratio within the
-- bound for every other value of threads (2) against 1 thread').
-- Adaptive repeats: a cell with runs of an adaptive sweep (cell_cache.design_level) is compared
-- at its design's nominal level (the smaller of the two cells'), and test says so
-- ('mann-whitney exact at p <= 0.0175 (adaptive repeats)'; runner/planning/sequential.py).
-- busy_set_aside: the ok runs of the row's cell and reference cell that started on a busy
-- machine and that their statistics leave out (a clean run of the same repeat exists:
-- cell_facts_live); observed ends with '; 2 busy runs set aside' when there are any.
-- largest_share reads every ok run's layer profile (each run's shares, within the run).
WITH registered AS NOT MATERIALIZED (
    SELECT * FROM study_cells  -- materialise.py reads only the studies it computes again
),
f AS (
    SELECT s.study, s.title, d.finding, d.position, d.claim, d.cite, d.check_kind, d.options,
        d.options ->> 'x'                                                    AS xk,
        d.options ->> 'metric'                                               AS metric,
        coalesce(d.options ->> 'metric', '') IN ('throughput', 'accuracy', 'tokens_per_second') AS lib,
        coalesce(json_extract_string(d.options, '$.along[*]'), []::VARCHAR[]) AS along,
        d.options ->> 'kind'                                                 AS kind,
        d.options ->> 'expect'                                               AS expect,
        d.options ->> 'value'                                                AS value_text,
        d.options ->> 'ref'                                                  AS ref_text,
        TRY_CAST(d.options ->> 'tolerance' AS DOUBLE)                        AS tolerance,
        TRY_CAST(d.options ->> 'at_least' AS DOUBLE)                         AS at_least,
        TRY_CAST(d.options ->> 'at_most' AS DOUBLE)                          AS at_most,
        TRY_CAST(d.options ->> 'about' AS DOUBLE)                            AS about,
        CASE WHEN json_type(d.options, '$.where') = 'OBJECT' THEN d.options -> 'where' END AS where_obj
    FROM study_findings AS d
    JOIN studies AS s USING (study)
),
sc AS (
    SELECT DISTINCT study, cell_id FROM registered
),
-- the statistics of the studies' cells (cell_stats' and the other metrics' values over each
-- cell's ok runs, the hosts' largest CPU count), computed once
cs AS MATERIALIZED (
    SELECT cell_id, fingerprint, entries, env_id, runs, busy_set_aside, design_level, framework, model, dataset,
        device, cpu_count, train_s_values, test_s_values, accuracy_values, throughput_values, epoch_s_values,
        rss_peak_mb_values, cpu_total_values, device_memory_peak_mb_values, tokens_per_second_values,
        perplexity_values
    FROM cell_cache
    WHERE cell_id IN (SELECT cell_id FROM registered)
),
-- largest_share and the share:<kind> metrics: per ok run with a layer profile, each kind's
-- summed forward + backward time
layer_runs AS (
    SELECT cell_id, run_id, sum(t) AS total, max(t) AS top, arg_max(kind, t) AS top_kind,
        list(struct_pack(kind := kind, t := t)) AS kinds
    FROM (
        SELECT r.cell_id, l.run_id, l.kind,
            sum(coalesce(l.forward_seconds, 0) + coalesce(l.backward_seconds, 0)) AS t
        FROM layers AS l
        JOIN runs AS r USING (run_id)
        WHERE r.status = 'ok' AND r."repeat" <> canary_repeat() AND r.cell_id IN (SELECT cell_id FROM registered)
        GROUP BY r.cell_id, l.run_id, l.kind
    )
    GROUP BY cell_id, run_id
),
-- the share:<kind> metrics: per cell and kind, the kind's share of each ok run's layer time
-- (sorted; a run whose profile lacks the kind counts 0)
layer_share_values AS (
    SELECT cell_id, kind, list(share ORDER BY share) FILTER (WHERE share IS NOT NULL) AS vals
    FROM (
        SELECT lr.cell_id, k.kind,
            coalesce(list_sum(list_transform(list_filter(lr.kinds, lambda j: j.kind = k.kind),
                                             lambda j: j.t)), 0) / nullif(lr.total, 0) AS share
        FROM layer_runs AS lr
        JOIN (SELECT DISTINCT cell_id, unnest(kinds).kind AS kind FROM layer_runs) AS k USING (cell_id)
    )
    GROUP BY cell_id, kind
),
-- each finding's cells, with only what the checks below read (the rows are many)
cells AS (
    SELECT f.study, f.finding, f.check_kind, f.xk, f.metric, f.lib, f.along, f.value_text,
        f.ref_text, f.at_most, c.cell_id, c.fingerprint, c.entries, c.env_id, c.cpu_count, c.design_level,
        CASE WHEN regexp_full_match(f.xk, '[a-z][a-z0-9_]*') THEN entries_value(c.entries, f.xk) END AS xv,
        CASE WHEN starts_with(f.metric, 'share:') THEN ls.vals
             ELSE finding_values(f.metric, c.train_s_values, c.test_s_values, c.accuracy_values,
                                 c.throughput_values, c.epoch_s_values, c.rss_peak_mb_values,
                                 c.cpu_total_values, c.device_memory_peak_mb_values,
                                 c.tokens_per_second_values, c.perplexity_values) END AS vals
    FROM f
    JOIN sc USING (study)
    JOIN cs AS c USING (cell_id)
    LEFT JOIN layer_share_values AS ls
           ON ls.cell_id = c.cell_id AND starts_with(f.metric, 'share:') AND ls.kind = f.metric[7:]
    WHERE f.check_kind <> 'largest_share' AND entries_match(c.entries, f.where_obj)
),
configured AS (
    SELECT * EXCLUDE (entries, along, env_id),
        CASE WHEN check_kind IN ('proportional', 'sublinear') AND TRY_CAST(xv AS DOUBLE) <= 0 THEN NULL
             ELSE TRY_CAST(xv AS DOUBLE) END AS xn,
        list_median(vals) AS med,
        entries_config_id(entries, list_concat([xk], along),
                          CASE WHEN list_has_any(list_concat([xk], along), ['variant', 'framework', 'version'])
                               THEN NULL ELSE env_id END) AS config
    FROM cells
    WHERE xv IS NOT NULL AND coalesce(len(vals), 0) > 0
),
pts AS (
    SELECT *,
        struct_pack(cell := cell_id, xv := xv, xn := xn, vals := vals, med := med,
                    label := fmt_x(xk, xv), fp := fingerprint, lvl := design_level) AS pt,
        max(cpu_count) OVER (PARTITION BY study, finding, config) AS cpu
    FROM configured
    QUALIFY row_number() OVER (PARTITION BY study, finding, config, xv ORDER BY len(vals) DESC, cell_id) = 1
),
grp AS (
    SELECT study, finding, config,
        any_value(cpu)                                                         AS cpu,
        count(*)                                                               AS npts,
        string_agg(pt.label, ', ' ORDER BY xn NULLS LAST, xv)                  AS have,
        arg_min(pt, xn) FILTER (WHERE xn IS NOT NULL)                          AS lo,
        arg_max(pt, xn) FILTER (WHERE xn IS NOT NULL)                          AS hi,
        arg_max(pt, xn) FILTER (WHERE xn > cpu)                                AS over,
        arg_max(pt, struct_pack(m := CASE WHEN lib THEN med ELSE -med END, c := cell_id))
            FILTER (WHERE xn <= cpu)                                           AS under,
        arg_max(pt, struct_pack(m := CASE WHEN lib THEN med ELSE -med END, c := cell_id)) AS best,
        arg_min(pt, struct_pack(m := CASE WHEN lib THEN med ELSE -med END, c := cell_id)) AS worst,
        arg_min(pt, cell_id) FILTER (WHERE xv = value_text
                                        OR TRY_CAST(xv AS DOUBLE) = TRY_CAST(value_text AS DOUBLE)) AS val,
        arg_min(pt, cell_id) FILTER (WHERE xv = ref_text
                                        OR TRY_CAST(xv AS DOUBLE) = TRY_CAST(ref_text AS DOUBLE)) AS ref
    FROM pts
    WHERE check_kind NOT IN ('bounded', 'largest_share')
    GROUP BY study, finding, config
),
tested AS (
    SELECT f.*, g.config, g.cpu, g.npts, g.have, t.a, t.b,
        CASE WHEN t.a.cell <> t.b.cell
             THEN compare_samples(t.a.vals, t.b.vals, level := least(t.a.lvl, t.b.lvl)) END AS cmp,
        t.a.med / nullif(t.b.med, 0)                                              AS ratio,
        t.a.xn / nullif(t.b.xn, 0)                                                AS xratio,
        CASE WHEN f.lib THEN 1 ELSE -1 END                                        AS sgn
    FROM grp AS g
    JOIN f USING (study, finding)
    CROSS JOIN LATERAL (SELECT
        CASE f.check_kind WHEN 'oversubscription' THEN g.over WHEN 'spread' THEN g.worst
                          WHEN 'option' THEN g.val ELSE g.hi END AS a,
        CASE f.check_kind WHEN 'oversubscription' THEN g.under WHEN 'spread' THEN g.best
                          WHEN 'option' THEN g.ref ELSE g.lo END AS b) AS t
),
pair_rows AS (
    SELECT study, finding, config,
        coalesce(a.cell, b.cell) AS cell_id, CASE WHEN a.cell <> b.cell THEN b.cell END AS ref_cell_id,
        CASE
            WHEN cmp IS NULL THEN 'not enough data'
            WHEN NOT cmp.significant THEN 'not significant'
            WHEN check_kind = 'proportional' THEN
                CASE WHEN cmp.direction > 0 AND abs(ratio / xratio - 1) <= tolerance + 1e-9
                     THEN 'reproduced' ELSE 'contradicted' END
            WHEN check_kind = 'trend' THEN
                CASE WHEN cmp.direction = CASE expect WHEN 'increases' THEN 1 ELSE -1 END
                     THEN 'reproduced' ELSE 'contradicted' END
            WHEN check_kind = 'oversubscription' THEN
                CASE WHEN cmp.direction * sgn < 0 THEN 'reproduced' ELSE 'contradicted' END
            WHEN check_kind = 'spread' THEN
                CASE WHEN cmp.direction * sgn < 0 AND greatest(ratio, 1 / ratio) >= at_least - 1e-9
                     THEN 'reproduced' ELSE 'contradicted' END
            WHEN check_kind = 'sublinear' THEN
                CASE WHEN cmp.direction * sgn > 0 AND pow(ratio, sgn) / xratio < 1
                     THEN 'reproduced' ELSE 'contradicted' END
            WHEN check_kind = 'option' THEN
                CASE WHEN (expect = 'differs' OR cmp.direction = CASE expect WHEN 'increases' THEN 1 ELSE -1 END)
                          AND (about IS NULL OR abs(abs(ratio - 1) - about) <= tolerance + 1e-9)
                     THEN 'reproduced' ELSE 'contradicted' END
        END AS verdict,
        CASE WHEN cmp IS NULL THEN
            CASE check_kind
                WHEN 'oversubscription' THEN
                    CASE WHEN cpu IS NULL THEN 'the host''s CPU count is not recorded'
                         WHEN a IS NULL THEN 'no ' || xk || ' above the host''s ' || cpu || ' CPUs'
                         ELSE 'no ' || xk || ' at or below the host''s ' || cpu || ' CPUs' END
                WHEN 'option' THEN
                    'no cell with ' || fmt_x(xk, CASE WHEN a IS NULL THEN value_text ELSE ref_text END)
                    || ' has ok runs'
                WHEN 'spread' THEN 'fewer than two values of ' || xk || ' with ok runs'
                ELSE 'fewer than two ' || CASE WHEN check_kind = 'trend' THEN '' ELSE 'positive ' END
                     || 'numbers of ' || xk || ' with ok runs'
            END || ' (have: ' || have || ')'
        ELSE
            a.label || ': ' || fmt_metric(a.med, metric) || ' vs ' || b.label || ': '
            || fmt_metric(b.med, metric) || ' ('
            || CASE check_kind
                WHEN 'proportional' THEN fmt_cmp_ratio(ratio, cmp, false) || ' for ' || fmt_ratio(xratio) || ' the ' || xk
                                         || ': ' || format('{:.2f}', ratio / xratio) || ' of proportional'
                WHEN 'sublinear' THEN fmt_cmp_ratio(pow(ratio, sgn), cmp, sgn < 0) || ' speedup for ' || fmt_ratio(xratio)
                                      || ' the ' || xk || ': efficiency ' || format('{:.2f}', pow(ratio, sgn) / xratio)
                WHEN 'oversubscription' THEN fmt_cmp_ratio(ratio, cmp, false) || '; the host has ' || cpu || ' CPUs'
                WHEN 'spread' THEN fmt_cmp_ratio(greatest(ratio, 1 / ratio), cmp, ratio < 1) || ' apart; ' || npts
                                   || ' values of ' || xk
                ELSE CASE WHEN metric = 'accuracy' THEN format('{:+.2f} pp', (a.med - b.med) * 100)
                          ELSE fmt_cmp_ratio(ratio, cmp, false) || ', ' || format('{:+.1f} %', (ratio - 1) * 100) END
               END || ')'
        END AS observed,
        CASE WHEN cmp IS NOT NULL THEN ratio END AS ratio,
        CASE WHEN cmp IS NULL THEN NULL
            WHEN check_kind = 'proportional' THEN ratio / xratio
            WHEN check_kind = 'sublinear' THEN pow(ratio, sgn) / xratio
            WHEN check_kind = 'spread' THEN greatest(ratio, 1 / ratio)
            ELSE ratio
        END AS effect,
        cmp.ratio_low AS ratio_low, cmp.ratio_high AS ratio_high, cmp.ratio_level AS ratio_level,
        cmp.p_value AS p_value,
        cmp.test || CASE WHEN cmp.level < 0.05
                         THEN format(' at p <= {:.4f} (adaptive repeats)', cmp.level) ELSE '' END AS test,
        coalesce(cmp.n, len(coalesce(a.vals, b.vals))) AS n,
        cmp.ref_n AS ref_n
    FROM tested
),
-- bounded: every value of x against the reference value
bref AS (
    SELECT study, finding, config,
        coalesce(arg_min(pt, cell_id) FILTER (WHERE xv = ref_text
                                                 OR TRY_CAST(xv AS DOUBLE) = TRY_CAST(ref_text AS DOUBLE)),
                 arg_min(pt, xn) FILTER (WHERE xn IS NOT NULL),
                 arg_min(pt, xv)) AS b,
        count(*) AS npts
    FROM pts
    WHERE check_kind = 'bounded'
    GROUP BY study, finding, config
),
bdev AS (
    SELECT p.study, p.finding, p.config, p.metric, p.xk, p.at_most, r.b, r.npts, p.pt AS a,
        CASE WHEN p.metric = 'accuracy' THEN (p.med - r.b.med) * 100
             ELSE p.med / nullif(r.b.med, 0) - 1 END AS dev,
        compare_samples(p.vals, r.b.vals, level := least(p.pt.lvl, r.b.lvl)) AS cmp,
        CASE WHEN p.metric = 'accuracy' THEN shift_ci(p.vals, r.b.vals) END AS sh
    FROM pts AS p
    JOIN bref AS r USING (study, finding, config)
    WHERE p.check_kind = 'bounded' AND p.cell_id <> r.b.cell
),
-- each comparison's Hodges-Lehmann interval in the bound's units (percentage points of the
-- difference for accuracy, shift_ci; else the ratio, compare_samples) and where it lies:
-- within_ci (inside the bound), inside (within_ci, a 95 % interval, the median within too)
bint AS (
    SELECT *,
        coalesce(abs(dev) > at_most + 1e-9, true) AS exceeds,
        coalesce(CASE WHEN metric = 'accuracy' THEN lo >= -at_most - 1e-9 AND hi <= at_most + 1e-9
                      ELSE lo >= 1 - at_most - 1e-9 AND hi <= 1 + at_most + 1e-9 END, false) AS within_ci
    FROM (
        SELECT *,
            CASE WHEN metric = 'accuracy' THEN sh.shift_low * 100 ELSE cmp.ratio_low END AS lo,
            CASE WHEN metric = 'accuracy' THEN sh.shift_high * 100 ELSE cmp.ratio_high END AS hi,
            CASE WHEN metric = 'accuracy' THEN sh.shift_level ELSE cmp.ratio_level END AS lvl,
            coalesce(CASE WHEN metric = 'accuracy' THEN sh.shift_note ELSE cmp.ratio_note END,
                     'no values to compare') AS note
        FROM bdev
    )
),
-- the comparison that decides: a significant change beyond the bound, else one whose interval
-- is not inside it, else (all inside) the largest change
bpick AS (
    SELECT *,
        within_ci AND NOT exceeds AND coalesce(lvl >= 0.95 - 1e-9, false) AS inside,
        min(lvl) OVER w AS min_lvl, max(lvl) OVER w AS max_lvl
    FROM bint
    WINDOW w AS (PARTITION BY study, finding, config)
    QUALIFY row_number() OVER (PARTITION BY study, finding, config
        ORDER BY exceeds AND coalesce(cmp.significant, false) DESC,
                 NOT (within_ci AND NOT exceeds AND coalesce(lvl >= 0.95 - 1e-9, false)) DESC,
                 exceeds DESC, abs(dev) DESC NULLS FIRST, a.cell) = 1
),
bounded_rows AS (
    SELECT r.study, r.finding, r.config,
        coalesce(p.a.cell, r.b.cell) AS cell_id, CASE WHEN p.a IS NOT NULL THEN r.b.cell END AS ref_cell_id,
        CASE WHEN p.a IS NULL THEN 'not enough data'
             WHEN p.exceeds AND coalesce(p.cmp.significant, false) THEN 'contradicted'
             WHEN coalesce(p.inside, false) THEN 'reproduced'
             ELSE 'not significant' END AS verdict,
        CASE WHEN p.a IS NULL THEN 'fewer than two values of ' || f.xk || ' with ok runs (have: '
                                   || r.b.label || ')'
             ELSE 'largest change: ' || p.a.label || ': ' || fmt_metric(p.a.med, f.metric) || ' vs '
                  || r.b.label || ': ' || fmt_metric(r.b.med, f.metric) || ' ('
                  || CASE WHEN f.metric = 'accuracy' THEN fmt_pp_ci(p.dev, p.lo, p.hi, p.lvl)
                          ELSE fmt_cmp_ratio(p.dev + 1, p.cmp, false) || ', '
                               || format('{:+.1f} %', p.dev * 100) END
                  || '); ' || r.npts || ' values of ' || f.xk
                  || CASE WHEN (p.exceeds AND coalesce(p.cmp.significant, false)) OR coalesce(p.inside, false) THEN ''
                          ELSE '; ' || CASE
                              WHEN p.lo IS NULL OR p.hi IS NULL
                                   THEN 'no interval (' || regexp_replace(p.note, ': no interval.*$', '') || ')'
                              WHEN NOT p.within_ci THEN 'interval ' || p.span || p.at_level || ' reaches beyond ' || p.bound
                              WHEN NOT p.exceeds THEN 'interval ' || p.span || ' within ' || p.bound
                                                      || ', but at ' || format('{:.0f}', p.lvl * 100) || ' %, not 95 %'
                              ELSE 'the median beyond ' || p.bound || ', not significant' END
                               || ': more runs needed' END
        END AS observed,
        p.dev AS effect,
        CASE WHEN p.a IS NOT NULL THEN p.a.med / nullif(r.b.med, 0) END AS ratio,
        p.cmp.ratio_low AS ratio_low, p.cmp.ratio_high AS ratio_high, p.cmp.ratio_level AS ratio_level,
        p.cmp.p_value AS p_value,
        CASE WHEN p.a IS NULL THEN NULL
             WHEN p.exceeds THEN p.cmp.test
             WHEN coalesce(p.inside, false)
             THEN 'Hodges–Lehmann ' || CASE WHEN p.max_lvl - p.min_lvl > 1e-9 THEN 'at least ' ELSE '' END
                  || format('{:.0f}', p.min_lvl * 100) || ' % interval of the ' || p.what
                  || ' within the bound for every other value of ' || f.xk || ' (' || (r.npts - 1)
                  || ') against ' || r.b.label
             ELSE 'Hodges–Lehmann ' || coalesce(format('{:.0f}', p.lvl * 100) || ' % ', '')
                  || 'interval of the ' || p.what || ' against the bound' END AS test,
        coalesce(p.cmp.n, len(r.b.vals)) AS n,
        p.cmp.ref_n AS ref_n
    FROM bref AS r
    JOIN f USING (study, finding)
    LEFT JOIN (
        SELECT *,
            CASE WHEN metric = 'accuracy' THEN format('{:+.2f} to {:+.2f} pp', lo, hi)
                 ELSE replace(fmt_ratio(lo), '×', '') || '–' || replace(fmt_ratio(hi), '×', '') END AS span,
            CASE WHEN lvl < 0.95 THEN ' at ' || format('{:.0f}', lvl * 100) || ' %' ELSE '' END AS at_level,
            '±' || CASE WHEN metric = 'accuracy' THEN fmt_num(at_most) || ' pp'
                        ELSE fmt_num(at_most * 100) || ' %' END AS bound,
            CASE WHEN metric = 'accuracy' THEN 'difference' ELSE 'ratio' END AS what
        FROM bpick
    ) AS p USING (study, finding, config)
),
shares AS (
    SELECT f.study, f.finding, f.kind, lr.cell_id, lr.total, lr.top, lr.top_kind,
        coalesce(list_sum(list_transform(list_filter(lr.kinds, lambda k: k.kind = f.kind),
                                         lambda k: k.t)), 0) AS kt
    FROM f
    JOIN sc USING (study)
    JOIN layer_runs AS lr USING (cell_id)
    JOIN cs AS c USING (cell_id)
    WHERE f.check_kind = 'largest_share' AND entries_match(c.entries, f.where_obj)
),
share_cells AS (
    SELECT study, finding, cell_id, any_value(kind) AS kind,
        count(*)                                                  AS nruns,
        count(*) FILTER (WHERE kt > 0 AND kt >= top)              AS nlargest,
        median(kt / nullif(total, 0))                             AS share,
        mode(top_kind) FILTER (WHERE NOT (kt > 0 AND kt >= top))  AS rival
    FROM shares
    GROUP BY study, finding, cell_id
    HAVING max(kt) > 0
),
share_rows AS (
    SELECT s.study, s.finding, entries_config_id(c.entries, []::VARCHAR[], c.env_id) AS config,
        s.cell_id, NULL::VARCHAR AS ref_cell_id,
        CASE WHEN s.nruns < 3 THEN 'not enough data'
             WHEN s.nlargest = s.nruns THEN 'reproduced'
             WHEN s.nlargest = 0 THEN 'contradicted'
             ELSE 'not significant' END AS verdict,
        s.kind || ' layers: ' || format('{:.0f} %', s.share * 100) || ' of layer time (median of '
            || s.nruns || ' runs), the largest kind in ' || s.nlargest || ' of ' || s.nruns || ' runs'
            || coalesce('; ' || s.rival || ' in the others', '')
            || CASE WHEN s.nruns < 3 THEN '; 3 runs needed' ELSE '' END AS observed,
        s.share AS effect,
        NULL::DOUBLE AS ratio, NULL::DOUBLE AS ratio_low, NULL::DOUBLE AS ratio_high, NULL::DOUBLE AS ratio_level,
        NULL::DOUBLE AS p_value,
        'the largest kind in every run (at least 3)' AS test,
        s.nruns AS n,
        NULL::BIGINT AS ref_n
    FROM share_cells AS s
    JOIN cs AS c USING (cell_id)
),
verdicts AS (
    SELECT study, finding, config, cell_id, ref_cell_id, verdict, observed, effect, ratio, ratio_low,
           ratio_high, ratio_level, p_value, test, n, ref_n FROM pair_rows
    UNION ALL
    SELECT study, finding, config, cell_id, ref_cell_id, verdict, observed, effect, ratio, ratio_low,
           ratio_high, ratio_level, p_value, test, n, ref_n FROM bounded_rows
    UNION ALL
    SELECT study, finding, config, cell_id, ref_cell_id, verdict, observed, effect, ratio, ratio_low,
           ratio_high, ratio_level, p_value, test, n, ref_n FROM share_rows
),
ok_cells AS (
    SELECT sc.study, count(*) AS cells
    FROM sc JOIN cs AS c USING (cell_id)
    WHERE c.runs > 0
    GROUP BY sc.study
),
fallback AS (
    SELECT f.study, f.finding, NULL::VARCHAR AS config, NULL::VARCHAR AS cell_id,
        NULL::VARCHAR AS ref_cell_id, 'not enough data' AS verdict,
        CASE WHEN o.cells IS NULL THEN 'no ok runs of this study''s cells yet'
             WHEN f.check_kind = 'largest_share'
                 THEN 'no ok run of this study''s cells has a layer profile with ' || f.kind || ' layers'
             ELSE 'no cell of this study with ok runs has values of ' || f.metric || ' and of ' || f.xk
        END AS observed,
        NULL::DOUBLE AS effect, NULL::DOUBLE AS ratio, NULL::DOUBLE AS ratio_low, NULL::DOUBLE AS ratio_high,
        NULL::DOUBLE AS ratio_level, NULL::DOUBLE AS p_value, NULL::VARCHAR AS test,
        NULL::BIGINT AS n, NULL::BIGINT AS ref_n
    FROM f
    LEFT JOIN ok_cells AS o USING (study)
    WHERE NOT EXISTS (SELECT 1 FROM verdicts AS v WHERE v.study = f.study AND v.finding = f.finding)
),
all_rows AS (
    SELECT * FROM verdicts
    UNION ALL BY NAME
    SELECT * FROM fallback
),
-- config_label: a configuration in words, made within its study (whose rows are read together,
-- as the report's table of verdicts): the row's cell's parameters less what the finding
-- compares (x, along) and seed.  framework · model · dataset, then every other parameter whose
-- value differs between the study's rows, as key=value in key order (fmt_param); when more than
-- 4 differ, a row names one only where its value is not the study's most common one (none is
-- common to rows that lack it), so a broad study reads 'torch · lenet5 · mnist · threads=8'.
-- '–' when nothing is left to name; NULL for a row without a configuration.
shown AS (
    SELECT r.study, r.finding, r.config,
        list_filter(c.entries, lambda x: x.k <> 'seed' AND x.k IS DISTINCT FROM f.xk
                                         AND NOT list_contains(f.along, x.k)) AS params
    FROM f
    JOIN all_rows AS r USING (study, finding)
    JOIN cs AS c ON c.cell_id = coalesce(r.cell_id, r.ref_cell_id)
    WHERE r.config IS NOT NULL
),
shown_params AS (  -- each row's entry of every parameter its study's rows name (NULL: it has none)
    SELECT s.study, s.finding, s.config, k.k, list_filter(s.params, lambda x: x.k = k.k)[1] AS p
    FROM shown AS s
    JOIN (SELECT DISTINCT study, unnest(list_transform(params, lambda x: x.k)) AS k FROM shown) AS k USING (study)
    WHERE k.k NOT IN ('framework', 'model', 'dataset')
),
varying AS (  -- the parameters whose value differs between a study's rows, and its most common
    SELECT study, k,
        CASE WHEN count(*) FILTER (WHERE kv IS NULL) = 0
             THEN arg_min(kv, struct_pack(n := -n, kv := kv)) END AS common,
        count(*) OVER (PARTITION BY study) AS nvarying
    FROM (SELECT study, k, p.kv AS kv, count(*) AS n FROM shown_params GROUP BY study, k, p.kv)
    GROUP BY study, k
    HAVING count(*) > 1
),
labels AS (
    SELECT s.study, s.finding, s.config,
        coalesce(nullif(concat_ws(' · ', entries_value(s.params, 'framework'), entries_value(s.params, 'model'),
                                  entries_value(s.params, 'dataset'), p.parts), ''), '–') AS config_label
    FROM shown AS s
    LEFT JOIN (
        SELECT sp.study, sp.finding, sp.config,
            string_agg(fmt_param(sp.p), ' · ' ORDER BY sp.k)
                FILTER (WHERE sp.p IS NOT NULL AND (v.nvarying <= 4 OR sp.p.kv IS DISTINCT FROM v.common)) AS parts
        FROM shown_params AS sp
        JOIN varying AS v USING (study, k)
        GROUP BY sp.study, sp.finding, sp.config
    ) AS p USING (study, finding, config)
)
SELECT
    f.study, f.title, f.finding, f.claim, f.cite, f.check_kind,
    r.config, l.config_label, c.framework, c.model, c.dataset, c.device,
    f.xk AS x,
    r.verdict,
    r.observed || CASE WHEN b.n > 0 THEN '; ' || b.n || ' busy run' || CASE WHEN b.n = 1 THEN '' ELSE 's' END
                                         || ' set aside' ELSE '' END AS observed,
    r.effect, r.ratio, r.ratio_low, r.ratio_high, r.ratio_level,
    CASE f.check_kind
        WHEN 'proportional' THEN f.metric || ' grows in proportion to ' || f.xk || ': (' || f.metric
            || ' ratio) / (' || f.xk || ' ratio) within 1 ± ' || fmt_num(f.tolerance)
            || ', the largest ' || f.xk || ' against the smallest'
        WHEN 'trend' THEN f.metric || ' ' || f.expect || ' with ' || f.xk
            || ' (the largest ' || f.xk || ' against the smallest)'
        WHEN 'oversubscription' THEN f.metric || ' at the most ' || f.xk
            || ' above the host''s CPU count is worse than the best at or below it'
        WHEN 'spread' THEN 'the best and the worst ' || f.xk || ' differ in ' || f.metric
            || ' by at least ' || fmt_ratio(f.at_least)
        WHEN 'bounded' THEN f.metric || ' of every ' || f.xk || ' within '
            || CASE WHEN f.metric = 'accuracy' THEN fmt_num(f.at_most) || ' pp'
                    ELSE fmt_num(f.at_most * 100) || ' %' END
            || ' of ' || coalesce(fmt_x(f.xk, f.ref_text) || ' (else ', '(')
            || 'the smallest ' || f.xk || ')'
        WHEN 'option' THEN fmt_x(f.xk, f.value_text) || ' against ' || fmt_x(f.xk, f.ref_text) || ': '
            || f.metric || ' ' || f.expect
            || coalesce(' by about ' || fmt_num(f.about * 100) || ' % (± '
                        || fmt_num(f.tolerance * 100) || ' %)', '')
        WHEN 'largest_share' THEN f.kind
            || ' layers take the largest share of layer time in every ok run (at least 3 runs)'
        WHEN 'sublinear' THEN 'more ' || f.xk || ' improve ' || f.metric || ', by less than the ratio of '
            || f.xk || ' (efficiency < 1)'
    END AS expected,
    r.p_value, r.test, r.n, r.ref_n, r.cell_id, r.ref_cell_id, f.position, b.n AS busy_set_aside
FROM f
JOIN all_rows AS r USING (study, finding)
LEFT JOIN labels AS l USING (study, finding, config)
LEFT JOIN cs AS c ON c.cell_id = coalesce(r.cell_id, r.ref_cell_id)
LEFT JOIN cs AS rc ON rc.cell_id = r.ref_cell_id
CROSS JOIN LATERAL (SELECT coalesce(c.busy_set_aside, 0) + coalesce(rc.busy_set_aside, 0) AS n) AS b
ORDER BY f.study, f.position, r.config NULLS LAST, r.cell_id
