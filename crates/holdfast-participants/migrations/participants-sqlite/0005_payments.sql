-- Reference participant `payments` on SQLite: account balances in minor units.
-- capacity (the balance) = available + authorised + captured.
CREATE TABLE account (
    resource   TEXT    PRIMARY KEY,
    available  INTEGER NOT NULL CHECK (available >= 0),
    authorised INTEGER NOT NULL DEFAULT 0 CHECK (authorised >= 0),
    captured   INTEGER NOT NULL DEFAULT 0 CHECK (captured >= 0)
) STRICT;

CREATE TABLE authorisation (
    reservation_id TEXT    NOT NULL,
    branch_id      TEXT    NOT NULL,
    resource       TEXT    NOT NULL REFERENCES account (resource),
    amount_minor   INTEGER NOT NULL CHECK (amount_minor > 0),
    state          TEXT    NOT NULL CHECK (state IN ('authorised', 'captured', 'voided')),
    held_until     INTEGER NOT NULL,
    PRIMARY KEY (reservation_id, branch_id, resource)
) STRICT;

CREATE TABLE payment (
    payment_ref    TEXT    PRIMARY KEY,
    resource       TEXT    NOT NULL REFERENCES account (resource),
    amount_minor   INTEGER NOT NULL CHECK (amount_minor > 0),
    currency       TEXT    NOT NULL,
    refunded_minor INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor)
) STRICT;

CREATE TABLE refund (
    refund_id      TEXT    PRIMARY KEY,
    payment_ref    TEXT    NOT NULL REFERENCES payment (payment_ref),
    reservation_id TEXT    NOT NULL,
    amount_minor   INTEGER NOT NULL CHECK (amount_minor > 0),
    currency       TEXT    NOT NULL,
    reason         TEXT    NOT NULL DEFAULT '',
    created_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000)
) STRICT;
CREATE INDEX refund_payment_idx ON refund (payment_ref);
