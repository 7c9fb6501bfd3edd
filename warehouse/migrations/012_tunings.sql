-- Tunings (issue 30): what `matrun tune` searched and found.  A tuning is identified by its
-- space (the matrix's axes after its profile and --set values), objective, accuracy bound,
-- sampler and seed; its trials are the configurations the search asked for, each a real cell
-- (cell_id) whose runs are in `runs` like any other, or a combination refused at plan time
-- (cell_id NULL).  A trial row is written once the trial is decided, so a tuning killed at any
-- point resumes from its trials; the tuning's row is replaced as it goes (status, summary).

CREATE TABLE tunings (
    tuning       VARCHAR NOT NULL,            -- 16 hex: the digest of its definition
    matrix       VARCHAR NOT NULL,            -- the matrix file's path, as given
    sweep        VARCHAR NOT NULL,            -- the matrix's sweep name
    objective    VARCHAR NOT NULL,            -- throughput, train_s or j_per_image
    direction    VARCHAR NOT NULL,            -- maximize or minimize
    accuracy_within DOUBLE,                   -- points below the default cell's accuracy allowed (NULL: none)
    sampler      VARCHAR NOT NULL,            -- tpe, optuna or random
    seed         INTEGER NOT NULL,
    space        JSON NOT NULL,               -- {axes, zips, fixed, size, profile, overrides}
    status       VARCHAR NOT NULL,            -- running, done, stopped
    budget       JSON NOT NULL,               -- {runs, seconds}: the last budget given
    summary      JSON,                        -- the answer, importances and trace (runner/sweep/tune.py)
    started_at   TIMESTAMP NOT NULL,          -- UTC
    updated_at   TIMESTAMP NOT NULL
);

CREATE TABLE tuning_trials (
    tuning       VARCHAR NOT NULL,
    trial        INTEGER NOT NULL,            -- from 0, in the order decided
    kind         VARCHAR NOT NULL,            -- default, search or confirm
    framework    VARCHAR,
    params       JSON NOT NULL,               -- the searched parameters' values
    label        VARCHAR NOT NULL,            -- key=value of the searched parameters
    cell_id      VARCHAR,                     -- NULL: refused at plan time
    state        VARCHAR NOT NULL,            -- ok, infeasible, failed, refused
    value        DOUBLE,                      -- the objective's median over the cell's ok runs
    accuracy     DOUBLE,                      -- median test accuracy
    runs         INTEGER NOT NULL,            -- runs the trial added (0: its cell had them already)
    seconds      DOUBLE NOT NULL,             -- wall time the trial took
    reason       VARCHAR NOT NULL,            -- why refused, failed or infeasible ('' when ok)
    decided_at   TIMESTAMP NOT NULL
);
