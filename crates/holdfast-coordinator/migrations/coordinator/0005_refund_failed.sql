-- Refunds a payment service refuses for good (no such payment, another currency, more than is
-- left to refund, not a payments service) become FAILED with the reason (SPEC 8.1): parked,
-- not retried; a person settles them. Transient failures stay PENDING and are retried.
ALTER TABLE reservations DROP CONSTRAINT reservations_refund_state_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_refund_state_check
    CHECK (refund_state IN ('PENDING', 'REFUNDED', 'FAILED'));
ALTER TABLE reservations ADD COLUMN refund_failure text;

ALTER TABLE extra_payments DROP CONSTRAINT extra_payments_refund_state_check;
ALTER TABLE extra_payments ADD CONSTRAINT extra_payments_refund_state_check
    CHECK (refund_state IN ('PENDING', 'REFUNDED', 'FAILED'));
ALTER TABLE extra_payments ADD COLUMN refund_failure text;
