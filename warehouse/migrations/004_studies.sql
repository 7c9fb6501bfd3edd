-- Studies and their findings (issue 12): what a study file declares ([study], [[findings]],
-- [paper]; warehouse/findings.py) and the cells each of its profiles plans.  Written by
-- `matrun sweep` before it runs a study and by `matrun studies --register`; a study declared
-- again replaces its row, its findings and the cells of that profile.  The `findings` view
-- turns them into verdicts.

CREATE TABLE studies (
    study        VARCHAR NOT NULL,            -- [study] id: A6, D-engine, demo
    title        VARCHAR NOT NULL,
    seed         VARCHAR NOT NULL,            -- the seed file ('' when none)
    source       VARCHAR NOT NULL,            -- the paper's table / figure
    needs        VARCHAR NOT NULL,            -- cpu or gpu
    gpus         INTEGER NOT NULL,            -- most GPUs a cell of the base matrix needs
    "view"       VARCHAR,                     -- the study view its report page is shaped from
    matrix       VARCHAR NOT NULL,            -- the study file it was declared from
    paper        JSON,                        -- {source, note, x, metric, columns, rows}
    declared_at  TIMESTAMP NOT NULL           -- UTC
);

CREATE TABLE study_findings (
    study        VARCHAR NOT NULL,
    finding      VARCHAR NOT NULL,
    position     INTEGER NOT NULL,            -- order in the study file, from 0
    claim        VARCHAR NOT NULL,
    cite         VARCHAR NOT NULL,
    check_kind   VARCHAR NOT NULL,            -- proportional, trend, oversubscription, …
    options      JSON NOT NULL                -- the check's keys, defaults filled in
);

CREATE TABLE study_cells (
    study        VARCHAR NOT NULL,
    profile      VARCHAR NOT NULL,            -- a [profiles.<name>], or '(base)'
    cell_id      VARCHAR NOT NULL
);
