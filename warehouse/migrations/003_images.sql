-- Framework images (issue 4): what `matrun build` built and what its probe found inside,
-- and, on each run, the image the cell ran in (docker executor; NULL for local runs).
-- `image_digest` is the first repository digest when the image came from a registry, else
-- the image ID (a locally built image has no repository digest): the content address.

CREATE TABLE images (
    tag               VARCHAR NOT NULL,           -- matrun/<framework>:<variant>-<content hash 12>
    image_id          VARCHAR NOT NULL,           -- sha256:…
    framework         VARCHAR NOT NULL,
    variant           VARCHAR NOT NULL,
    content_hash      VARCHAR NOT NULL,           -- build context + base image ID + recipe
    recipe_hash       VARCHAR,                    -- Dockerfile + pins + build args (the env_id)
    base_image        VARCHAR,
    size_bytes        BIGINT,
    build_seconds     DOUBLE,                     -- NULL: found already built
    recorded_at       TIMESTAMP NOT NULL,
    framework_version VARCHAR,
    python            VARCHAR,
    cuda              VARCHAR,
    cudnn             VARCHAR,
    blas              VARCHAR,
    onednn            VARCHAR,
    openmp            VARCHAR,
    pins              JSON,                       -- {"torch": "2.13.0", …}
    probe             JSON                        -- the probe's full record
);

ALTER TABLE runs ADD COLUMN image_tag VARCHAR;
ALTER TABLE runs ADD COLUMN image_id VARCHAR;
ALTER TABLE runs ADD COLUMN image_digest VARCHAR;
