-- Readiness (SPEC 7.4): `/readyz` commits a write to this one row, so a coordinator whose
-- database file cannot be written (disk full) is not ready. Nothing reads it.
CREATE TABLE IF NOT EXISTS write_probe (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at INTEGER NOT NULL
) STRICT;
