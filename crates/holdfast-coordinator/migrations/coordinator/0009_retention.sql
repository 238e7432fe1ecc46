-- Retention (SPEC 8.3): finished reservations are found oldest first by their last change
-- (`updated_at`, the time they reached their terminal state), so each purge batch walks this
-- index instead of the table. Numbered 0009: 0008 is left to the audit table.
CREATE INDEX IF NOT EXISTS reservations_finished
    ON reservations (updated_at)
    WHERE state IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED');
