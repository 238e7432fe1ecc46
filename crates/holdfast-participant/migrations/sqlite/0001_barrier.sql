-- The participant SDK's barrier on SQLite (same meaning as migrations/participants/0001):
-- times are INTEGER microseconds since the Unix epoch, items JSON text.
CREATE TABLE tcc_barrier (
    participant    TEXT    NOT NULL,
    reservation_id TEXT    NOT NULL,
    branch_id      TEXT    NOT NULL,
    state          TEXT    NOT NULL
        CHECK (state IN ('trying', 'held', 'rejected', 'confirmed', 'cancelled', 'hold_lost')),
    try_answer     TEXT    CHECK (try_answer IN ('held', 'rejected')),
    try_reason     TEXT    NOT NULL DEFAULT '',
    holder         TEXT    NOT NULL DEFAULT '',
    items          TEXT    NOT NULL DEFAULT '[]',
    expires_at     INTEGER,
    reclaim_after  INTEGER,
    created_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    updated_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    PRIMARY KEY (participant, reservation_id, branch_id)
) STRICT;

CREATE INDEX tcc_barrier_orphans ON tcc_barrier (participant, reclaim_after) WHERE state = 'held';
