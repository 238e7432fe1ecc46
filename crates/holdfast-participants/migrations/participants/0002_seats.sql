-- Reference participant `seats`: one row per seat (capacity 1); the hold token and the
-- deadline live on the row.
CREATE TABLE seat (
    resource       text        PRIMARY KEY,
    state          text        NOT NULL DEFAULT 'available'
        CHECK (state IN ('available', 'held', 'confirmed')),
    -- The holding branch (the hold token), NULL when available.
    reservation_id text,
    branch_id      text,
    -- expires_at + orphan_grace of the hold; informational (the SDK reclaims by its barrier).
    held_until     timestamptz,
    CHECK ((state = 'available') = (branch_id IS NULL))
);
CREATE INDEX seat_branch_idx ON seat (reservation_id, branch_id) WHERE branch_id IS NOT NULL;
