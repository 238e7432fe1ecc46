-- Every CHECK constraint's list of allowed values (and the waitlist trigger's WHEN) written as one
-- array constant, `col = ANY ('{A,B}'::text[])`, instead of `col IN ('A', 'B')`, which
-- PostgreSQL stores as an `ARRAY['A', 'B']` of separate literals. PostgreSQL reads a table's
-- CHECK expressions (and a row trigger's WHEN) from their stored text and plans them again in
-- every statement that writes the table, and planning folds an `ARRAY[...]` of literals into a
-- constant by running it through the executor: a fixed cost on every INSERT and UPDATE of
-- `reservations` and `branches`, the hot path's statements (about a third of the cost of a
-- Reserve+Confirm's writes of `reservations` on one backend: BENCHMARKS.md, "Investigations",
-- 2026-12-06 session 30). The rules are the same, value for value.
--
-- Each constraint is replaced under its own name, NOT VALID: every existing row was checked by
-- the constraint it replaces, which allowed exactly the same values, so the table is not scanned
-- again under the migration's lock. New and updated rows are checked as before.
ALTER TABLE reservations
    DROP CONSTRAINT reservations_state_check,
    ADD CONSTRAINT reservations_state_check CHECK (state = ANY (
        '{TRYING,HELD,CONFIRMING,CONFIRMED,CANCELLING,CANCELLED,EXPIRED,REJECTED,FAILED,QUEUED}'::text[]
    )) NOT VALID,
    DROP CONSTRAINT reservations_release_outcome_check,
    ADD CONSTRAINT reservations_release_outcome_check CHECK (release_outcome = ANY (
        '{CANCELLED,EXPIRED,REJECTED,FAILED,QUEUED}'::text[]
    )) NOT VALID,
    DROP CONSTRAINT reservations_refund_state_check,
    ADD CONSTRAINT reservations_refund_state_check CHECK (refund_state = ANY (
        '{PENDING,REFUNDED,FAILED}'::text[]
    )) NOT VALID;

ALTER TABLE branches
    DROP CONSTRAINT branches_state_check,
    ADD CONSTRAINT branches_state_check CHECK (state = ANY (
        '{PENDING,HELD,REJECTED,CONFIRMED,CANCELLED,HOLD_LOST}'::text[]
    )) NOT VALID;

ALTER TABLE extra_payments
    DROP CONSTRAINT extra_payments_refund_state_check,
    ADD CONSTRAINT extra_payments_refund_state_check CHECK (refund_state = ANY (
        '{PENDING,REFUNDED,FAILED}'::text[]
    )) NOT VALID;

ALTER TABLE admin_audit
    DROP CONSTRAINT admin_audit_action_check,
    ADD CONSTRAINT admin_audit_action_check CHECK (action = ANY (
        '{force_cancel,resolve_confirmed,resolve_cancelled,retry}'::text[]
    )) NOT VALID;

-- 0016_waitlists.sql's trigger, its WHEN as one array constant.
DROP TRIGGER reservations_left_queues ON reservations;
CREATE TRIGGER reservations_left_queues AFTER UPDATE OF state ON reservations
    FOR EACH ROW WHEN (NEW.queued_at IS NOT NULL AND NEW.state = ANY (
        '{HELD,CONFIRMING,CONFIRMED,CANCELLED,EXPIRED,REJECTED,FAILED}'::text[]))
    EXECUTE FUNCTION holdfast_leave_queues();
