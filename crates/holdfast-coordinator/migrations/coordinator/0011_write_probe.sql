-- Readiness (SPEC 7.4): `/readyz` commits a write to this one row, so a replica whose database
-- refuses writes (disk full, read-only, a demoted primary) is not ready. Nothing reads it.
CREATE TABLE IF NOT EXISTS write_probe (
    id        SMALLINT PRIMARY KEY CHECK (id = 1),
    probed_at TIMESTAMPTZ NOT NULL
);
