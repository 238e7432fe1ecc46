-- Reference participant `seats` on SQLite: one row per seat (capacity 1).
CREATE TABLE seat (
    resource       TEXT    PRIMARY KEY,
    state          TEXT    NOT NULL DEFAULT 'available'
        CHECK (state IN ('available', 'held', 'confirmed')),
    reservation_id TEXT,
    branch_id      TEXT,
    held_until     INTEGER,
    CHECK ((state = 'available') = (branch_id IS NULL))
) STRICT;
CREATE INDEX seat_branch_idx ON seat (reservation_id, branch_id) WHERE branch_id IS NOT NULL;
