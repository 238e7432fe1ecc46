-- Payments are bound to reservations (SPEC 7.3): migrations/coordinator/0004 in SQLite's
-- dialect (UUIDs as 16-byte BLOBs, times as INTEGER microseconds from the database clock).
-- One payment_ref (at one payment participant) belongs to at most one reservation.
CREATE UNIQUE INDEX reservations_payment_binding
    ON reservations (payment_participant, payment_ref) WHERE payment_ref IS NOT NULL;

-- Further payments for a reservation whose own payment was settled: each refunded in full,
-- until acknowledged.
CREATE TABLE extra_payments (
    payment_participant TEXT    NOT NULL,
    payment_ref         TEXT    NOT NULL,
    reservation_id      BLOB    NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    amount_minor        INTEGER NOT NULL CHECK (amount_minor > 0),
    currency            TEXT    NOT NULL,
    refund_id           BLOB    NOT NULL UNIQUE CHECK (length(refund_id) = 16),
    refund_state        TEXT    NOT NULL CHECK (refund_state IN ('PENDING', 'REFUNDED')),
    refund_reason       TEXT    NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     INTEGER,
    created_at          INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    PRIMARY KEY (payment_participant, payment_ref)
) STRICT;
CREATE INDEX extra_payments_by_reservation ON extra_payments (reservation_id, created_at);
CREATE INDEX extra_payments_due ON extra_payments (next_attempt_at) WHERE refund_state = 'PENDING';
