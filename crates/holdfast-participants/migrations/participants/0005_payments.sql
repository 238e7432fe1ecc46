-- Reference participant `payments`: account balances in minor units.
-- capacity (the balance) = available + authorised + captured.
CREATE TABLE account (
    resource   text   PRIMARY KEY,
    available  bigint NOT NULL CHECK (available >= 0),
    authorised bigint NOT NULL DEFAULT 0 CHECK (authorised >= 0),
    captured   bigint NOT NULL DEFAULT 0 CHECK (captured >= 0)
);

-- A branch's authorisation on one account: Try authorises, Confirm captures, Cancel voids.
CREATE TABLE authorisation (
    reservation_id text        NOT NULL,
    branch_id      text        NOT NULL,
    resource       text        NOT NULL REFERENCES account (resource),
    amount_minor   bigint      NOT NULL CHECK (amount_minor > 0),
    state          text        NOT NULL CHECK (state IN ('authorised', 'captured', 'voided')),
    held_until     timestamptz NOT NULL,
    PRIMARY KEY (reservation_id, branch_id, resource)
);

-- Captures made outside any reservation (Charge), refundable through tcc.v1.Payments.
CREATE TABLE payment (
    payment_ref    text        PRIMARY KEY,
    resource       text        NOT NULL REFERENCES account (resource),
    amount_minor   bigint      NOT NULL CHECK (amount_minor > 0),
    currency       text        NOT NULL,
    refunded_minor bigint      NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor)
);

CREATE TABLE refund (
    refund_id      text        PRIMARY KEY,
    payment_ref    text        NOT NULL REFERENCES payment (payment_ref),
    reservation_id text        NOT NULL,
    amount_minor   bigint      NOT NULL CHECK (amount_minor > 0),
    currency       text        NOT NULL,
    reason         text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX refund_payment_idx ON refund (payment_ref);
