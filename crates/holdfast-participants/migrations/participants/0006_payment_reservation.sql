-- Payments are bound to reservations (SPEC 7.3): a charge records the reservation it was made
-- for, and GetPayment answers it, so the coordinator can refuse a payment cited by another
-- reservation's Confirm. NULL for payments charged before this migration.
ALTER TABLE payment ADD COLUMN reservation_id text;
