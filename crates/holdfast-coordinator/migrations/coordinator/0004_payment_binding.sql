-- Payments are bound to reservations (SPEC 7.3). One payment_ref (at one payment participant)
-- belongs to at most one reservation: a Confirm citing a payment recorded on another
-- reservation is refused (PAYMENT_MISMATCH); when two race, this index decides.
-- (A database recorded before this migration with one payment on two reservations must have
-- the duplicate resolved by hand before it applies.)
CREATE UNIQUE INDEX reservations_payment_binding
    ON reservations (payment_participant, payment_ref) WHERE payment_ref IS NOT NULL;

-- Further payments: a Confirm citing a payment other than the reservation's own, after that
-- was settled (the reservation is confirmed, with another payment or none, or its payment was
-- refunded). Never dropped: each is refunded in full, sent to its payment participant until
-- acknowledged (refund_id is the idempotency key there), retried with backoff by recovery.
-- The primary key binds the payment to this one reservation, as the index above does for a
-- reservation's own payment.
CREATE TABLE extra_payments (
    payment_participant text        NOT NULL,
    payment_ref         text        NOT NULL,
    reservation_id      uuid        NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    amount_minor        bigint      NOT NULL CHECK (amount_minor > 0),
    currency            text        NOT NULL,
    refund_id           uuid        NOT NULL UNIQUE,
    refund_state        text        NOT NULL CHECK (refund_state IN ('PENDING', 'REFUNDED')),
    refund_reason       text        NOT NULL,
    attempts            integer     NOT NULL DEFAULT 0,
    -- When the refund is next due (NULL once acknowledged).
    next_attempt_at     timestamptz,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (payment_participant, payment_ref)
);
CREATE INDEX extra_payments_by_reservation ON extra_payments (reservation_id, created_at);
-- Refunds still owed (small: most are acknowledged at once).
CREATE INDEX extra_payments_due ON extra_payments (next_attempt_at) WHERE refund_state = 'PENDING';
