-- Retention (SPEC 8.3): finished reservations oldest first by their last change (see the
-- PostgreSQL migration of the same number).
CREATE INDEX IF NOT EXISTS reservations_finished
    ON reservations (updated_at)
    WHERE state IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED');
