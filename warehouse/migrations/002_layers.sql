-- Layer-wise forward / backward times (STUDIES.md D and E): one row per layer of a run
-- that asked for layer_profile.  Times are medians over `repeats` isolated executions of
-- the layer on real activations, device synchronised; params and flops are per sample.

CREATE TABLE layers (
    run_id            VARCHAR NOT NULL,
    name              VARCHAR NOT NULL,
    kind              VARCHAR NOT NULL,           -- conv, relu, maxpool, dense, …
    "index"           INTEGER,                    -- position in the network, from 0
    forward_seconds   DOUBLE,
    backward_seconds  DOUBLE,
    repeats           INTEGER,
    params            BIGINT,
    flops             BIGINT
);
