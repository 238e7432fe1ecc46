-- Reference participant `rooms` on SQLite: time-slot holds over [start_us, end_us). SQLite has
-- no exclusion constraint: the overlap check runs inside the BEGIN IMMEDIATE transaction of
-- the Try (the write lock makes check-then-insert atomic).
CREATE TABLE room (
    resource TEXT PRIMARY KEY
) STRICT;

CREATE TABLE slot_hold (
    id             INTEGER PRIMARY KEY,
    reservation_id TEXT    NOT NULL,
    branch_id      TEXT    NOT NULL,
    resource       TEXT    NOT NULL REFERENCES room (resource),
    start_us       INTEGER NOT NULL,
    end_us         INTEGER NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('held', 'confirmed', 'cancelled')),
    held_until     INTEGER NOT NULL,
    CONSTRAINT slot_hold_period CHECK (start_us < end_us)
) STRICT;
CREATE INDEX slot_hold_branch_idx ON slot_hold (reservation_id, branch_id);
CREATE INDEX slot_hold_active_idx ON slot_hold (resource, start_us) WHERE state IN ('held', 'confirmed');
