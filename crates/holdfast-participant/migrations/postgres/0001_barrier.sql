-- The participant SDK's barrier: one row per branch, written in the same local transaction as
-- the business change, so repeats, disorder (Cancel before Try) and races are decided here.
-- `participant` scopes rows so several participants may share one database.
CREATE TABLE tcc_barrier (
    participant    text        NOT NULL,
    reservation_id text        NOT NULL,
    branch_id      text        NOT NULL,
    -- 'trying' exists only inside an uncommitted transaction (the row was just inserted).
    state          text        NOT NULL
        CHECK (state IN ('trying', 'held', 'rejected', 'confirmed', 'cancelled', 'hold_lost')),
    -- The first answer given to Try; NULL while no Try has been answered.
    try_answer     text        CHECK (try_answer IN ('held', 'rejected')),
    try_reason     text        NOT NULL DEFAULT '',
    holder         text        NOT NULL DEFAULT '',
    -- The Try's items, so Confirm/Cancel/reclaim can hand them back to the business code.
    items          jsonb       NOT NULL DEFAULT '[]'::jsonb,
    expires_at     timestamptz,
    -- expires_at + orphan_grace: before it only the coordinator releases the hold.
    reclaim_after  timestamptz,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (participant, reservation_id, branch_id)
);

-- Finds orphaned holds (past expires_at + grace) cheaply.
CREATE INDEX tcc_barrier_orphans ON tcc_barrier (participant, reclaim_after) WHERE state = 'held';
