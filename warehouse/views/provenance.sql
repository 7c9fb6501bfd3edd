-- One row per run: where and with what it ran, and what the in-cell probe found in force.
-- `python` is the interpreter that ran the cell (the probe's), else the host's.
SELECT
    r.run_id,
    r.sweep,
    r.cell_id,
    r.host ->> 'hostname'                                AS hostname,
    r.host ->> 'cpu_model'                               AS cpu_model,
    TRY_CAST(r.host ->> 'cpu_count' AS INTEGER)          AS cpu_count,
    r.host ->> 'os'                                      AS os,
    coalesce(r.probe ->> 'python', r.host ->> 'python')  AS python,
    r.host ->> 'matrun_version'                          AS matrun_version,
    coalesce(r.probe ->> 'framework', r.params ->> 'framework') AS framework,
    r.probe ->> 'framework_version'                      AS framework_version,
    r.env_id,
    r.executor,
    r.image_tag,
    r.image_digest,
    i.blas                                               AS image_blas,
    i.onednn                                             AS image_onednn,
    r.probe -> 'in_force'                                AS in_force,
    r.probe -> 'libraries'                               AS libraries,
    r.probe ->> 'build'                                  AS build,
    r.probe -> 'mismatches'                              AS mismatches
FROM runs AS r
LEFT JOIN images AS i ON i.image_id = r.image_id AND i.tag = r.image_tag
ORDER BY r.sweep, r.cell_id, r."repeat", r.attempt
