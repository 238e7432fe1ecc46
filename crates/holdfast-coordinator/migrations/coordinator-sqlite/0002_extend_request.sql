-- The caller's key of the last applied Extend: a repeat of it answers the reservation as it is
-- instead of extending again (Extend is idempotent, like Confirm and Cancel).
ALTER TABLE reservations ADD COLUMN last_extend_request_id TEXT;
