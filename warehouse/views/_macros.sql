-- Statistics and parameter helpers shared by the views (docs/WAREHOUSE.md, "Statistics").
-- Created by every writer connect, before the views, as persistent DuckDB macros (so a
-- read-only connection finds them in the file).  Each statement creates one macro; the
-- file is split on the semicolons that end a line.  A list given to a macro holds the
-- non-NULL values of one cell's ok runs.  Lambdas use DuckDB's `lambda x: ...` syntax.
-- `list_transform([expr], lambda s: ...)[1]` binds `expr` to `s` once (a "let").

-- P(B <= j) for B ~ Binomial(n, 1/2).
CREATE OR REPLACE MACRO binom_half_cdf(j, n) AS
    list_sum(list_transform(range(0, j + 1),
        lambda i: exp(lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1) - n * ln(2))));

-- The rank k of the exact distribution-free confidence interval of the median,
-- [x(k), x(n+1-k)] of the sorted values: the largest k with 2 P(B <= k-1) <= 0.05, so the
-- interval covers the median with probability 1 - 2 P(B <= k-1) >= 0.95.  With n <= 5 no k
-- reaches 95 % and k = 1: the full range [min, max], whose coverage 1 - 2^(1-n) is < 0.95.
CREATE OR REPLACE MACRO median_ci_rank(n) AS
    greatest(1, len(list_filter(range(1, (n + 1) // 2 + 1),
        lambda k: 2 * binom_half_cdf(k - 1, n) <= 0.05)));

-- {low, high, level} of the median's interval over a list of values (NULL for fewer than
-- two values); `level` is the interval's exact coverage (>= 0.95 from 6 values on).
CREATE OR REPLACE MACRO median_ci(vals) AS
    list_transform([list_sort(vals)], lambda s: CASE WHEN coalesce(len(s), 0) < 2 THEN NULL ELSE
        list_transform([median_ci_rank(len(s))], lambda k: struct_pack(
            low := s[k],
            high := s[len(s) + 1 - k],
            level := 1 - 2 * binom_half_cdf(k - 1, len(s))))[1] END)[1];

-- The mid-rank (1-based, ties averaged) of every element of a list, in the list's order.
CREATE OR REPLACE MACRO midranks(v) AS
    list_transform(v, lambda a: len(list_filter(v, lambda b: b < a))
                              + (len(list_filter(v, lambda b: b = a)) + 1) / 2.0);

-- Mann-Whitney U of x against ref: pairs with x > ref, ties counting one half.
CREATE OR REPLACE MACRO mw_u(x, ref) AS
    coalesce(CAST(list_sum(list_transform(x, lambda a: list_sum(list_transform(ref,
        lambda b: CASE WHEN a > b THEN 1.0 WHEN a = b THEN 0.5 ELSE 0.0 END)))) AS DOUBLE), 0.0);

-- Exact two-sided permutation p-value of U: over every way of choosing which m of the
-- m + n pooled mid-ranks `r` belong to x, the share whose |U - mn/2| is at least the
-- observed one.  Exact with ties too.  2^(m+n) subsets: used up to m + n = 16.
CREATE OR REPLACE MACRO mw_p_exact(r, m, n, u) AS
    list_transform([list_filter(range(0, 1 << least(m + n, 16)), lambda mask: bit_count(mask) = m)],
        lambda masks: len(list_filter(masks, lambda mask:
            abs(list_sum(list_transform(range(0, m + n),
                    lambda i: CASE WHEN (mask >> i) & 1 = 1 THEN r[i + 1] ELSE 0.0 END))
                - m * (m + 1) / 2.0 - m * n / 2.0) >= abs(u - m * n / 2.0) - 1e-9))
            / len(masks))[1];

-- Two-sided p of a standard normal deviate z: erfc(|z| / sqrt 2), by the Chebyshev fit of
-- Numerical Recipes' erfcc (relative error < 1.2e-7).
CREATE OR REPLACE MACRO normal_two_sided_p(z) AS
    list_transform([abs(z) / sqrt(2)], lambda x: list_transform([1.0 / (1.0 + 0.5 * x)], lambda t:
        t * exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))))))[1])[1];

-- Normal approximation of the two-sided p of U, with the tie correction of the variance and
-- a continuity correction of 0.5: z = (|U - mn/2| - 0.5) / sigma.  All values tied: p = 1.
CREATE OR REPLACE MACRO mw_p_normal(v, m, n, u) AS
    list_transform([m * n / 12.0 * ((m + n + 1) - list_sum(list_transform(list_distinct(v),
            lambda d: pow(len(list_filter(v, lambda w: w = d)), 3) - len(list_filter(v, lambda w: w = d))))
            / ((m + n) * (m + n - 1.0)))],
        lambda var: CASE WHEN var <= 0 THEN 1.0
                         ELSE least(1.0, normal_two_sided_p(greatest(abs(u - m * n / 2.0) - 0.5, 0) / sqrt(var))) END)[1];

-- Can a two-sided exact Mann-Whitney test of m against n values reach p < 0.05 at all?
-- Its smallest p is 2 / C(m+n, m): yes from 4 vs 4, 3 vs 5, 2 vs 8 (2 vs 2: 1/3, 3 vs 3: 0.1).
CREATE OR REPLACE MACRO mw_can_decide(m, n) AS
    m >= 1 AND n >= 1 AND 2.0 / round(exp(lgamma(m + n + 1) - lgamma(m + 1) - lgamma(n + 1))) < 0.05;

-- The rank k of the Hodges-Lehmann interval of m against n values and its coverage:
-- {k, level}.  Up to m + n = 16 exact: the largest k with P(U <= k-1) <= 0.025 under the
-- null hypothesis (no ties), level = 1 - 2 P(U <= k-1), from the table below: row m, column
-- n (1 .. 16; NULL where m + n > 16) of k and of the count of the C(m+n, m) rank splits with
-- U <= k-1 (tests/test_effect_sizes.py enumerates every split with itertools and checks every
-- entry; a table because computing the distribution per comparison cost more than the rest
-- of the interval).  Beyond 16 values the normal approximation with a continuity correction:
-- k = floor(mn/2 + 1/2 - 1.96 sigma), sigma^2 = mn(m+n+1)/12.  When no k reaches 95 % (the
-- test cannot decide, mw_can_decide) k = 1 and level is the lower true coverage: 2 against
-- 2: 2/3; 1 against 1: 0.
CREATE OR REPLACE MACRO ratio_ci_rank_exact(m, n) AS
    struct_pack(
        k := [
            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, NULL,
            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, NULL, NULL,
            1, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, NULL, NULL, NULL,
            1, 1, 1, 1, 2, 3, 4, 5, 5, 6, 7, 8, NULL, NULL, NULL, NULL,
            1, 1, 1, 2, 3, 4, 6, 7, 8, 9, 10, NULL, NULL, NULL, NULL, NULL,
            1, 1, 2, 3, 4, 6, 7, 9, 11, 12, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 2, 4, 6, 7, 9, 11, 13, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 3, 5, 7, 9, 11, 14, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 3, 5, 8, 11, 13, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 4, 6, 9, 12, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 4, 7, 10, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 2, 5, 8, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 2, 5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL][(m - 1) * 16 + n],
        tail := [
            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, NULL,
            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, NULL, NULL,
            1, 1, 1, 1, 1, 2, 2, 4, 4, 7, 7, 11, 11, NULL, NULL, NULL,
            1, 1, 1, 1, 2, 4, 7, 12, 12, 18, 27, 38, NULL, NULL, NULL, NULL,
            1, 1, 1, 2, 4, 7, 19, 29, 42, 60, 83, NULL, NULL, NULL, NULL, NULL,
            1, 1, 2, 4, 7, 19, 30, 64, 124, 168, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 2, 7, 19, 30, 65, 129, 239, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 4, 12, 29, 64, 129, 321, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 4, 12, 42, 124, 239, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 7, 18, 60, 168, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 1, 7, 27, 83, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 2, 11, 38, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 2, 11, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, 2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL][(m - 1) * 16 + n]);

CREATE OR REPLACE MACRO ratio_ci_rank(m, n) AS
    CASE WHEN m + n <= 16 THEN
        list_transform([ratio_ci_rank_exact(m, n)], lambda e: struct_pack(k := e.k,
            level := 1 - 2 * e.tail / round(exp(lgamma(m + n + 1) - lgamma(m + 1) - lgamma(n + 1)))))[1]
    ELSE
        list_transform([sqrt(m * n * (m + n + 1) / 12.0)], lambda sigma:
            list_transform([greatest(1, floor(m * n / 2.0 + 0.5 - 1.959964 * sigma)::BIGINT)],
                lambda k: struct_pack(k := k,
                    level := 1 - normal_two_sided_p((k - 0.5 - m * n / 2.0) / sigma)))[1])[1]
    END;

-- The ratio x / ref as an effect size with a distribution-free interval, over two lists of
-- values without NULL or NaN (compare_samples' filtered lists): {ratio, ratio_hl, ratio_low,
-- ratio_high, ratio_level, ratio_note}.  ratio: the ratio of medians (the headline).  The
-- interval is Hodges-Lehmann's on the log scale: of the mn sorted pairwise differences
-- D = ln x_i - ln ref_j, [exp D(k), exp D(mn+1-k)] (ratio_ci_rank), ratio_hl = exp(median D),
-- ratio_level its coverage.  A value <= 0 or infinite has no logarithm, and 1 against 1 no
-- interval (level 0): then the interval is NULL and ratio_note says why.  NULL when either
-- list is empty.
CREATE OR REPLACE MACRO ratio_ci(x, ref) AS
    CASE WHEN coalesce(len(x), 0) = 0 OR coalesce(len(ref), 0) = 0 THEN NULL
    ELSE list_transform([struct_pack(
            ratio := list_median(x) / nullif(list_median(ref), 0),
            loggable := len(list_filter(list_concat(x, ref), lambda a: NOT (a > 0 AND isfinite(a)))) = 0,
            r := ratio_ci_rank(len(x), len(ref)))],
        lambda t: CASE
            WHEN NOT t.loggable THEN struct_pack(ratio := t.ratio, ratio_hl := NULL::DOUBLE,
                ratio_low := NULL::DOUBLE, ratio_high := NULL::DOUBLE, ratio_level := NULL::DOUBLE,
                ratio_note := 'a value <= 0 or infinite: no interval of the ratio')
            ELSE list_transform([list_transform(ref, lambda b: ln(b))], lambda lr: list_transform(
                [list_sort(flatten(list_transform(x, lambda a: list_transform([ln(a)], lambda la:
                    list_transform(lr, lambda lb: la - lb))[1])))], lambda d: struct_pack(
                ratio := t.ratio, ratio_hl := exp(list_median(d)),
                ratio_low := CASE WHEN t.r.level > 0 THEN exp(d[t.r.k]) END,
                ratio_high := CASE WHEN t.r.level > 0 THEN exp(d[len(d) + 1 - t.r.k]) END,
                ratio_level := CASE WHEN t.r.level > 0 THEN t.r.level END,
                ratio_note := CASE WHEN t.r.level <= 0 THEN 'one value on each side: no interval' END))[1])[1]
        END)[1]
    END;

-- The difference x - ref as an effect size with a distribution-free interval, ratio_ci's
-- counterpart on the original scale (findings' `bounded` check of accuracy, whose bound is in
-- percentage points): {shift, shift_hl, shift_low, shift_high, shift_level, shift_note}.
-- shift: the difference of medians.  The interval is Hodges-Lehmann's: of the mn sorted
-- pairwise differences D = x_i - ref_j, [D(k), D(mn+1-k)] with ratio_ci's rank k and
-- coverage (ratio_ci_rank), shift_hl = median D, shift_level the coverage.  NULL and NaN
-- values are left out (as compare_samples does; this macro is called on its own).  An
-- infinite value, or 1 against 1 (level 0), gives no interval and shift_note says why.  NULL
-- when either list has no value left.
CREATE OR REPLACE MACRO shift_ci(x, ref) AS
    list_transform([struct_pack(
            x := list_filter(x, lambda a: a IS NOT NULL AND NOT isnan(a)),
            ref := list_filter(ref, lambda a: a IS NOT NULL AND NOT isnan(a)))],
        lambda s: CASE WHEN coalesce(len(s.x), 0) = 0 OR coalesce(len(s.ref), 0) = 0 THEN NULL
        ELSE list_transform([struct_pack(
                shift := (list_median(s.x) - list_median(s.ref))::DOUBLE,
                finite := len(list_filter(list_concat(s.x, s.ref), lambda a: NOT isfinite(a))) = 0,
                r := ratio_ci_rank(len(s.x), len(s.ref)))],
            lambda t: CASE
                WHEN NOT t.finite THEN struct_pack(shift := t.shift, shift_hl := NULL::DOUBLE,
                    shift_low := NULL::DOUBLE, shift_high := NULL::DOUBLE, shift_level := NULL::DOUBLE,
                    shift_note := 'an infinite value: no interval of the difference')
                ELSE list_transform([list_sort(flatten(list_transform(s.x, lambda a:
                        list_transform(s.ref, lambda b: (a - b)::DOUBLE))))], lambda d: struct_pack(
                    shift := t.shift, shift_hl := list_median(d)::DOUBLE,
                    shift_low := CASE WHEN t.r.level > 0 THEN d[t.r.k] END,
                    shift_high := CASE WHEN t.r.level > 0 THEN d[len(d) + 1 - t.r.k] END,
                    shift_level := CASE WHEN t.r.level > 0 THEN t.r.level END,
                    shift_note := CASE WHEN t.r.level <= 0 THEN 'one value on each side: no interval' END))[1]
            END)[1]
        END)[1];

-- Compare the runs of a cell (x) with those of a reference cell (ref), both lists of values.
-- {n, ref_n, u, p_value, test, significant, direction, intervals_overlap, ratio, ratio_hl,
-- ratio_low, ratio_high, ratio_level, ratio_note, level} (the ratio fields: ratio_ci):
--   test: 'mann-whitney exact' (m + n <= 16) or 'mann-whitney normal' when the test can reach
--   p < 0.05 (mw_can_decide); otherwise 'interval overlap', and then `significant` is false
--   whatever the intervals do (with so few runs disjoint ranges happen by chance: 1 in 3 at
--   2 vs 2) - `intervals_overlap` is reported, never called a win.  p_value is the test's
--   p in every case (also where it cannot decide).  `level` (default 0.05): the significance
--   level; an adaptive sweep's cells are compared at their design's nominal level (p <= level,
--   cell_facts design_level, runner/planning/sequential.py), a NULL level is 0.05; returned
--   as `level`.  direction: +1 when x tends to be larger
--   (U > mn/2), -1 smaller, 0 neither.  Everything NULL when either side has no value.
CREATE OR REPLACE MACRO compare_samples(x, ref, level := 0.05) AS
    list_transform([struct_pack(
            x := list_filter(x, lambda a: a IS NOT NULL AND NOT isnan(a)),
            ref := list_filter(ref, lambda a: a IS NOT NULL AND NOT isnan(a)))],
        lambda s: list_transform([struct_pack(
                m := len(s.x), n := len(s.ref), u := mw_u(s.x, s.ref),
                v := list_concat(s.x, s.ref), r := midranks(list_concat(s.x, s.ref)),
                cx := median_ci(s.x), cr := median_ci(s.ref), e := ratio_ci(s.x, s.ref),
                x_lo := list_min(s.x), x_hi := list_max(s.x),
                r_lo := list_min(s.ref), r_hi := list_max(s.ref))],
            lambda t: CASE WHEN t.m = 0 OR t.n = 0 OR t.m IS NULL OR t.n IS NULL THEN NULL ELSE
                list_transform([CASE WHEN t.m + t.n <= 16 THEN mw_p_exact(t.r, t.m, t.n, t.u)
                                     ELSE mw_p_normal(t.v, t.m, t.n, t.u) END],
                    lambda p: struct_pack(
                        n := t.m, ref_n := t.n, u := t.u, p_value := p,
                        test := CASE WHEN NOT mw_can_decide(t.m, t.n) THEN 'interval overlap'
                                     WHEN t.m + t.n <= 16 THEN 'mann-whitney exact'
                                     ELSE 'mann-whitney normal' END,
                        significant := mw_can_decide(t.m, t.n)
                            AND (p < coalesce(level, 0.05) OR (coalesce(level, 0.05) < 0.05 AND p <= level + 1e-12)),
                        direction := sign(t.u - t.m * t.n / 2.0)::INTEGER,
                        intervals_overlap := NOT (coalesce(t.cx.high, t.x_hi) < coalesce(t.cr.low, t.r_lo)
                                               OR coalesce(t.cr.high, t.r_hi) < coalesce(t.cx.low, t.x_lo)),
                        ratio := t.e.ratio, ratio_hl := t.e.ratio_hl, ratio_low := t.e.ratio_low,
                        ratio_high := t.e.ratio_high, ratio_level := t.e.ratio_level,
                        ratio_note := t.e.ratio_note, level := coalesce(level, 0.05)::DOUBLE))[1]
            END)[1])[1];

-- The words for a comparison: `better` / `worse` when significant (direction times +1 when
-- larger is better, -1 when smaller is), 'not significant' when not, NULL without a test.
CREATE OR REPLACE MACRO verdict(cmp, larger_is_better, better, worse) AS
    CASE WHEN cmp IS NULL OR cmp.significant IS NULL THEN NULL
         WHEN NOT cmp.significant THEN 'not significant'
         WHEN cmp.direction * CASE WHEN larger_is_better THEN 1 ELSE -1 END > 0 THEN better
         ELSE worse END;

-- A row of a comparison view against its reference cell (is_ref: the row is the reference
-- itself): 'reference' / false for the reference, else verdict(...) / cmp.significant.
CREATE OR REPLACE MACRO ref_verdict(is_ref, cmp, larger_is_better, better, worse) AS
    CASE WHEN is_ref THEN 'reference' ELSE verdict(cmp, larger_is_better, better, worse) END;
CREATE OR REPLACE MACRO ref_significant(is_ref, cmp) AS
    CASE WHEN is_ref THEN false ELSE cmp.significant END;

-- Coefficient of variation (sample standard deviation / mean), an aggregate; NULL below 2.
-- The sample standard deviation, NaN when a value is NaN or infinite (DuckDB's stddev_samp
-- raises an out-of-range error on an infinity).
CREATE OR REPLACE MACRO sd(x) AS
    CASE WHEN count(x) FILTER (WHERE NOT isfinite(x)) > 0 THEN 'nan'::DOUBLE
         ELSE stddev_samp(x) FILTER (WHERE isfinite(x)) END;

CREATE OR REPLACE MACRO cv(x) AS sd(x) / nullif(avg(x), 0);

-- A cell's parameters (p, JSON) as entries {k, kv, v} sorted by key, keys whose value is
-- null left out (so a key an older matrun did not write and a null one read the same):
-- kv = 'key=<the value as JSON>', v = the value as text (json_extract_string).  The study
-- views read them from the cell cache instead of parsing the JSON again.
CREATE OR REPLACE MACRO params_entries(p) AS
    list_transform(
        list_filter(list_sort(json_keys(p)), lambda k: json_type(p, '$."' || k || '"') <> 'NULL'),
        lambda k: struct_pack(k := k, kv := k || '=' || json_extract(p, '$."' || k || '"')::VARCHAR,
                              v := json_extract_string(p, '$."' || k || '"')));

-- A canonical text of a cell's parameters without the keys in `drop` (the axes a view
-- varies): its entries' key=value pairs, in key order.
CREATE OR REPLACE MACRO entries_key(e, drop) AS
    array_to_string(list_transform(list_filter(e, lambda x: NOT list_contains(drop, x.k)), lambda x: x.kv), ';');
CREATE OR REPLACE MACRO params_key(p, drop) AS entries_key(params_entries(p), drop);

-- A short id of a configuration: the first 12 hex digits of the key's MD5.
CREATE OR REPLACE MACRO entries_config_id(e, drop, env) AS
    left(md5(entries_key(e, drop) || '|' || coalesce(env, '')), 12);
CREATE OR REPLACE MACRO config_id(p, drop, env) AS entries_config_id(params_entries(p), drop, env);

-- The value of parameter `key` as text, from a cell's entries (NULL: absent or null).
CREATE OR REPLACE MACRO entries_value(e, key) AS list_filter(e, lambda x: x.k = key)[1].v;

-- The framework facts are not written here: warehouse/framework_sql.py renders them from
-- images/*/framework.toml and creates them before this file's macros.
-- framework_default_layout(framework), framework_default_conv_algo(framework, device): the
-- framework's own default layout and GPU convolution-algorithm choice ([defaults]; on the CPU
-- there is no choice: heuristic); framework_builtin_blas(framework): the BLAS built into it
-- (builtin_blas); framework_preset_hyperparams(framework, family): {optimizer, lr, batch_size}
-- of its example for the dataset family ([presets.<family>]).  NULL for what a framework
-- does not declare.

-- The BLAS of a run from its probe record: the library the probe found mapped
-- (`blas_loaded`, with its version), else the framework's build information
-- (`BLAS_INFO=mkl`), else a non-numpy BLAS that threadpoolctl saw, else the BLAS built into
-- the framework (framework_builtin_blas); the same order as `matrun build`'s image summary.
CREATE OR REPLACE MACRO probe_blas(probe, framework) AS
    coalesce(
        json_extract_string(probe, '$.blas_loaded.provider')
            || coalesce(' ' || json_extract_string(probe, '$.blas_loaded.version'), ''),
        nullif(regexp_extract(coalesce(json_extract_string(probe, '$.build'), ''), 'BLAS_INFO=(\w+)', 1), ''),
        list_transform(list_filter(CAST(coalesce(json_extract(probe, '$.libraries'), '[]') AS JSON[]),
                lambda l: json_extract_string(l, '$.user_api') = 'blas'
                          AND NOT regexp_matches(coalesce(json_extract_string(l, '$.path'),
                                                          json_extract_string(l, '$.name'), ''),
                                                 'numpy|scipy_openblas')),
            lambda l: json_extract_string(l, '$.internal_api')
                      || coalesce(' ' || json_extract_string(l, '$.version'), ''))[1],
        framework_builtin_blas(framework));

-- The hyper-parameters a cell has when the matrix leaves them to the preset: preset "none"
-- gives matrun's defaults (docs/MATRIX.md), "framework-default" the framework's example for
-- the dataset family (mnist also stands for fashion-mnist; framework_preset_hyperparams,
-- runner/planning/presets.py, docs/PRESETS.md; tests/test_study_views.py checks both against
-- the Python side).  {optimizer, lr, batch_size}; NULL where no preset exists.
CREATE OR REPLACE MACRO default_hyperparams(framework, dataset, preset) AS
    CASE WHEN preset = 'none' THEN struct_pack(optimizer := 'sgd', lr := 0.01::DOUBLE, batch_size := 64)
    ELSE framework_preset_hyperparams(framework, CASE WHEN dataset = 'fashion-mnist' THEN 'mnist' ELSE dataset END)
    END;

-- Numbers in sentences (the `findings` view's `observed`): three significant digits, thousands
-- separated (1,210; 812; 11.4; 1.23; 0.0123); 'n/a' for NULL or NaN.
CREATE OR REPLACE MACRO fmt_num(v) AS
    CASE WHEN v IS NULL OR isnan(v) THEN 'n/a'
         WHEN abs(v) >= 999.5 THEN format('{:,.0f}', v)
         WHEN abs(v) >= 99.95 THEN format('{:.0f}', v)
         WHEN abs(v) >= 9.995 THEN format('{:.1f}', v)
         WHEN abs(v) >= 0.9995 THEN format('{:.2f}', v)
         WHEN v = 0 THEN '0'
         ELSE printf('%.3g', v) END;

-- A ratio: "0.67×", "1.49×", "12.3×".
CREATE OR REPLACE MACRO fmt_ratio(r) AS
    CASE WHEN r IS NULL OR isnan(r) THEN 'n/a'
         WHEN abs(r) >= 0.01 AND abs(r) < 9.995 THEN format('{:.2f}×', r)
         ELSE fmt_num(r) || '×' END;

-- A ratio with its interval (compare_samples' ratio fields): "1.39× (1.31–1.47)"; below 95 %
-- coverage the level too: "1.39× (0.90–2.10 at 67 %)"; without an interval fmt_ratio alone.
CREATE OR REPLACE MACRO fmt_ratio_ci(r, low, high, level) AS
    CASE WHEN low IS NULL OR high IS NULL OR r IS NULL OR isnan(r) THEN fmt_ratio(r)
         ELSE fmt_ratio(r) || ' (' || replace(fmt_ratio(low), '×', '') || '–'
              || replace(fmt_ratio(high), '×', '')
              || CASE WHEN level < 0.95 THEN ' at ' || format('{:.0f}', level * 100) || ' %' ELSE '' END
              || ')' END;

-- A difference in percentage points with its interval (shift_ci's fields times 100):
-- "-0.25 pp (-0.90 to +0.40)"; below 95 % coverage the level too: "+0.50 pp (-1.00 to +2.00
-- at 67 %)"; without an interval the difference alone.
CREATE OR REPLACE MACRO fmt_pp_ci(d, low, high, level) AS
    CASE WHEN d IS NULL OR isnan(d) THEN 'n/a pp'
         WHEN low IS NULL OR high IS NULL THEN format('{:+.2f} pp', d::DOUBLE)
         ELSE format('{:+.2f} pp ({:+.2f} to {:+.2f}', d::DOUBLE, low::DOUBLE, high::DOUBLE)
              || CASE WHEN level < 0.95 THEN ' at ' || format('{:.0f}', level * 100) || ' %' ELSE '' END
              || ')' END;

-- The label of a ratio r that is compare_samples' ratio (cmp) or, with inverted, its inverse:
-- fmt_ratio_ci with cmp's interval, inverted too.
CREATE OR REPLACE MACRO fmt_cmp_ratio(r, cmp, inverted) AS
    fmt_ratio_ci(r, CASE WHEN inverted THEN 1 / cmp.ratio_high ELSE cmp.ratio_low END,
                 CASE WHEN inverted THEN 1 / cmp.ratio_low ELSE cmp.ratio_high END, cmp.ratio_level);

-- A value of a findings metric with its unit: accuracy in %, throughput in img/s, step_s in
-- ms per image, memory in MiB, cpu_total in % of one core, tokens_per_second in tok/s,
-- perplexity a bare number, share:<kind> in % of layer time, the other metrics in seconds.
CREATE OR REPLACE MACRO fmt_metric(v, metric) AS
    CASE WHEN v IS NULL THEN 'n/a'
         WHEN metric = 'accuracy' THEN format('{:.2f} %', v * 100)
         WHEN metric = 'throughput' THEN fmt_num(v) || ' img/s'
         WHEN metric = 'step_s' THEN fmt_num(v * 1000) || ' ms/img'
         WHEN metric IN ('rss_peak_mb', 'device_memory_peak_mb') THEN fmt_num(v) || ' MiB'
         WHEN metric = 'cpu_total' THEN fmt_num(v) || ' % CPU'
         WHEN metric = 'tokens_per_second' THEN fmt_num(v) || ' tok/s'
         WHEN metric = 'perplexity' THEN 'perplexity ' || fmt_num(v)
         WHEN starts_with(metric, 'share:') THEN format('{:.1f} %', v * 100) || ' of layer time'
         ELSE fmt_num(v) || ' s' END;

-- A cell parameter's value in a sentence: counts as "8 threads" / "1 epoch", the rest as
-- "layout=nhwc".
CREATE OR REPLACE MACRO fmt_x(x, v) AS
    CASE WHEN x IN ('threads', 'interop_threads', 'epochs', 'iterations', 'workers', 'gpus', 'nodes')
              AND TRY_CAST(v AS DOUBLE) IS NOT NULL
         THEN v || ' ' || CASE WHEN TRY_CAST(v AS DOUBLE) = 1 THEN left(x, length(x) - 1) ELSE x END
         ELSE x || '=' || v END;

-- A cell parameter's entry (params_entries) as a label names it: key=value, booleans on / off
-- (the `findings` view's config_label).
CREATE OR REPLACE MACRO fmt_param(e) AS
    e.k || '=' || CASE e.kv WHEN e.k || '=true' THEN 'on' WHEN e.k || '=false' THEN 'off' ELSE e.v END;

-- Whether a cell's parameters (e: its entries; p: JSON) have every value a finding's `where`
-- table names (w, a JSON object, or NULL: every cell), compared as JSON text
-- (docs/WAREHOUSE.md "Findings").
CREATE OR REPLACE MACRO entries_match(e, w) AS
    w IS NULL OR len(list_filter(json_keys(w),
        lambda k: entries_value(e, k) IS DISTINCT FROM json_extract_string(w, '$."' || k || '"'))) = 0;
CREATE OR REPLACE MACRO params_match(p, w) AS entries_match(params_entries(p), w);

-- == The study views at scale (docs/WAREHOUSE.md "Views at scale") ==========================

-- The values of a findings metric over a cell's ok runs (views/findings.sql).
CREATE OR REPLACE MACRO finding_values(metric, train_s, test_s, accuracy, throughput, epoch_s,
                                       rss_peak_mb, cpu_total, device_memory_peak_mb,
                                       tokens_per_second, perplexity) AS
    CASE metric
        WHEN 'train_s' THEN train_s
        WHEN 'test_s' THEN test_s
        WHEN 'accuracy' THEN accuracy
        WHEN 'throughput' THEN throughput
        WHEN 'step_s' THEN list_transform(list_filter(throughput, lambda t: t > 0), lambda t: 1.0 / t)
        WHEN 'epoch_s' THEN epoch_s
        WHEN 'rss_peak_mb' THEN rss_peak_mb
        WHEN 'cpu_total' THEN cpu_total
        WHEN 'device_memory_peak_mb' THEN device_memory_peak_mb
        WHEN 'tokens_per_second' THEN tokens_per_second
        WHEN 'perplexity' THEN perplexity
    END;

-- Do the caches of the study views match the warehouse?  caches_match(): whether they were
-- filled from the runs the warehouse holds (their count and latest ingested_at) by these views
-- and macros (matrun_views_digest).  caches_current(): true, or it fails and says what to run,
-- so that a view read from a cache (warehouse/materialise.py; docs/WAREHOUSE.md "Views at
-- scale") never answers with the numbers of other runs.  Runs added or removed by another
-- client, or a warehouse no matrun writer opened since it was upgraded, do that.
CREATE OR REPLACE MACRO caches_match() AS (
    SELECT n.runs = 0 OR coalesce((
               SELECT bool_and(s.digest = matrun_views_digest() AND s.runs = n.runs
                               AND s.last_ingested_at IS NOT DISTINCT FROM n.last_ingested_at)
               FROM cache_state AS s), false)
    FROM (SELECT count(*) AS runs, max(ingested_at) AS last_ingested_at FROM runs) AS n);

CREATE OR REPLACE MACRO caches_current() AS
    CASE WHEN caches_match() THEN true
         ELSE error('the cached statistics of this warehouse are out of date (its runs changed '
                    || 'outside matrun, or no matrun writer opened it since it was upgraded): '
                    || 'run `matrun ingest` on it to bring them up to date') END;

-- The repeat of a canary run ([sweep] canary, docs/MATRIX.md): a run of a sweep's reference
-- cell made at intervals through the sweep to track the machine's drift (view canary_drift).
-- No sweep plans it (repeats are at most 1,000): the views of cells and runs leave it out.
-- The same number as warehouse/bundles/layout.py CANARY_REPEAT.
CREATE OR REPLACE MACRO canary_repeat() AS 1000000;

-- Where a sorted list v (4 values or more) splits at its largest gap with at least two values
-- on each side: the 1-based position of the last value below the gap (the first if tied).
CREATE OR REPLACE MACRO modes_split(v) AS
    1 + list_position(list_transform(range(2, len(v) - 1), lambda i: v[i + 1] - v[i]),
                      list_max(list_transform(range(2, len(v) - 1), lambda i: v[i + 1] - v[i])));

-- Two modes in a list of values (docs/WAREHOUSE.md "Bimodal cells"; the same rule as
-- warehouse/modes.py): split the sorted values at their largest gap leaving two or more on
-- each side; bimodal when the gap is more than 3 times the wider side's range and more than
-- 10 % of the median.  {bimodal, low_n, low_median, high_n, high_median, gap, spread}
-- (spread: the wider side's range); NULL for fewer than four values.
CREATE OR REPLACE MACRO two_modes(vals) AS
    list_transform([list_sort(list_filter(vals, lambda x: x IS NOT NULL))], lambda v:
        CASE WHEN len(v) < 4 THEN NULL ELSE
        list_transform([modes_split(v)], lambda k: struct_pack(
            bimodal := v[k + 1] - v[k] > 3 * greatest(v[k] - v[1], v[len(v)] - v[k + 1])
                       AND v[k + 1] - v[k] > 0.10 * list_median(v),
            low_n := k, low_median := list_median(v[1:k]),
            high_n := len(v) - k, high_median := list_median(v[k + 1:]),
            gap := v[k + 1] - v[k],
            spread := greatest(v[k] - v[1], v[len(v)] - v[k + 1])))[1] END)[1];
