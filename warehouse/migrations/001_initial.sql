-- The first warehouse schema.  One row of `runs` per result bundle; the per-step,
-- per-epoch and monitor records of that bundle in the three child tables, keyed by run_id.
-- Open-ended things (params, host, probe, …) stay JSON; what views aggregate is typed.
-- The warehouse is a DuckLake (docs/WAREHOUSE.md "Storage"): no PRIMARY KEY or UNIQUE
-- constraints (ingest keeps run_id unique under the writer lock), and time stamps are
-- TIMESTAMP in UTC, so any client reads them without a time zone module.  A warehouse of
-- the single-file format (schema 1-4) is upgraded by copying its rows into these tables.

CREATE TABLE runs (
    run_id              VARCHAR NOT NULL,         -- "<cell_id>/<repeat>-<attempt>"
    sweep               VARCHAR NOT NULL,
    cell_id             VARCHAR NOT NULL,
    "repeat"            INTEGER NOT NULL,         -- from 0
    attempt             INTEGER NOT NULL,         -- from 1
    env_id              VARCHAR NOT NULL,
    executor            VARCHAR NOT NULL,
    status              VARCHAR NOT NULL,         -- ok, failed, timeout, oom, cancelled
    exit_code           INTEGER,
    error_tail          VARCHAR,
    started_at          TIMESTAMP NOT NULL,
    ended_at            TIMESTAMP,
    wall_seconds        DOUBLE,
    params              JSON NOT NULL,            -- spec.json "params", fully resolved
    host                JSON,                     -- result.json "host"
    probe               JSON,                     -- events.jsonl probe record (NULL if none)
    data                JSON,                     -- events.jsonl data record
    model               JSON,                     -- events.jsonl model record
    summary             JSON,                     -- events.jsonl summary record
    monitor             JSON,                     -- result.json "monitor" (the aggregates)
    harness_version     VARCHAR,
    -- typed copies of the summary record
    train_seconds       DOUBLE,
    test_seconds        DOUBLE,
    accuracy            DOUBLE,
    throughput          DOUBLE,                   -- images/s, median over timed steps
    time_to_first_step  DOUBLE,
    timed_steps         INTEGER,
    warmup_steps        INTEGER,
    diverged            BOOLEAN,
    -- typed copies of the monitor aggregates
    monitor_interval_s  DOUBLE,
    monitor_samples     INTEGER,
    cpu_user_avg        DOUBLE,                   -- percent of one core
    cpu_system_avg      DOUBLE,
    cpu_total_avg       DOUBLE,
    iowait_avg          DOUBLE,
    rss_avg_bytes       DOUBLE,
    rss_peak_bytes      BIGINT,
    -- asked-versus-in-force differences the probe found (empty list: none; NULL: no probe)
    mismatches          VARCHAR[],
    events_truncated    BOOLEAN NOT NULL,         -- a cut-off last line was ignored
    bundle_path         VARCHAR NOT NULL,         -- absolute, where it was ingested from
    bundle_digest       VARCHAR NOT NULL,         -- sha256, see matrun.warehouse.bundles
    ingested_at         TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE steps (
    run_id   VARCHAR NOT NULL,
    epoch    INTEGER,
    step     INTEGER NOT NULL,                    -- global, from 0
    phase    VARCHAR NOT NULL,                    -- warmup or timed
    seconds  DOUBLE NOT NULL,
    images   INTEGER NOT NULL
);

CREATE TABLE epochs (
    run_id          VARCHAR NOT NULL,
    epoch           INTEGER NOT NULL,             -- from 0
    steps           INTEGER,
    train_loss      DOUBLE,                       -- NULL when it was NaN / inf
    train_accuracy  DOUBLE,
    test_loss       DOUBLE,
    test_accuracy   DOUBLE,
    epoch_seconds   DOUBLE,
    test_seconds    DOUBLE
);

CREATE TABLE monitor_samples (
    run_id      VARCHAR NOT NULL,
    t           DOUBLE NOT NULL,                  -- seconds since the cell started
    cpu_user    DOUBLE,
    cpu_system  DOUBLE,
    iowait      DOUBLE,
    rss_bytes   BIGINT,
    nprocs      INTEGER
);
