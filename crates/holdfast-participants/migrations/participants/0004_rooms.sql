-- Reference participant `rooms`: time-slot holds. The partial exclusion constraint rejects
-- overlapping active holds of one room (SQLSTATE 23P01); half-open ranges let adjacent
-- slots coexist; cancelled rows stay for explanation but free the slot.
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE room (
    resource text PRIMARY KEY
);

CREATE TABLE slot_hold (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id text        NOT NULL,
    branch_id      text        NOT NULL,
    resource       text        NOT NULL REFERENCES room (resource),
    during         tstzrange   NOT NULL,
    state          text        NOT NULL CHECK (state IN ('held', 'confirmed', 'cancelled')),
    held_until     timestamptz NOT NULL,
    CONSTRAINT slot_hold_period CHECK (
        NOT isempty(during) AND NOT lower_inf(during) AND NOT upper_inf(during)
        AND lower_inc(during) AND NOT upper_inc(during)
    ),
    CONSTRAINT slot_hold_no_overlap EXCLUDE USING gist (
        resource WITH =, during WITH &&
    ) WHERE (state IN ('held', 'confirmed'))
);
CREATE INDEX slot_hold_branch_idx ON slot_hold (reservation_id, branch_id);
