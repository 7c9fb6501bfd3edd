-- The per-iteration performance model (issue 16, docs/MODEL.md).  step_phases: one row per
-- phase of each sampled training step (events.jsonl "phases" records: the harness times the
-- phases of every phase_sampling-th timed step, those steps recorded with phase 'sampled'
-- and kept out of the throughput); a name joined by '+' is phases the framework runs fused.
-- exchange_calibration: a multi-worker cell's all-reduce timed over a few message sizes
-- (summary.exchange.calibration.points).  runs gains the bytes of one step's gradients and
-- the sampling interval.
CREATE TABLE step_phases (
    run_id        VARCHAR NOT NULL,
    step          INTEGER NOT NULL,    -- the step's index (steps.step)
    ordinal       INTEGER NOT NULL,    -- the phase's place in the step, from 0
    phase         VARCHAR NOT NULL,    -- input, h2d, forward, backward, exchange, update, or fused: a+b
    seconds       DOUBLE NOT NULL,
    step_seconds  DOUBLE               -- the whole step's seconds (steps.seconds)
);

CREATE TABLE exchange_calibration (
    run_id   VARCHAR NOT NULL,
    bytes    BIGINT NOT NULL,          -- the all-reduced message, bytes
    seconds  DOUBLE NOT NULL           -- median of the timed rounds
);

ALTER TABLE runs ADD COLUMN gradient_bytes BIGINT;   -- one step's gradients (parameters x element bytes)
ALTER TABLE runs ADD COLUMN phase_every INTEGER;     -- every this-many-th timed step sampled (0: none)
