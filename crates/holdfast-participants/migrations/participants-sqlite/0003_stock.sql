-- Reference participant `stock` on SQLite: a guarded non-negative counter plus quantity holds.
CREATE TABLE stock_item (
    resource  TEXT    PRIMARY KEY,
    available INTEGER NOT NULL CHECK (available >= 0),
    held      INTEGER NOT NULL DEFAULT 0 CHECK (held >= 0),
    confirmed INTEGER NOT NULL DEFAULT 0 CHECK (confirmed >= 0)
) STRICT;

CREATE TABLE stock_hold (
    reservation_id TEXT    NOT NULL,
    branch_id      TEXT    NOT NULL,
    resource       TEXT    NOT NULL REFERENCES stock_item (resource),
    quantity       INTEGER NOT NULL CHECK (quantity > 0),
    state          TEXT    NOT NULL CHECK (state IN ('held', 'confirmed', 'cancelled')),
    held_until     INTEGER NOT NULL,
    created_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    PRIMARY KEY (reservation_id, branch_id, resource)
) STRICT;
