-- Retention (SPEC 8.3): finished branches' barrier rows, oldest first by their last change.
CREATE INDEX IF NOT EXISTS tcc_barrier_finished
    ON tcc_barrier (participant, updated_at)
    WHERE state IN ('confirmed', 'cancelled', 'rejected');
