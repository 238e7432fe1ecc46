-- Every state change of a reservation is a non-HOT update (`state` is indexed), so each
-- new row version gets an entry in every index on the table. `refund_id`'s UNIQUE
-- constraint indexed every version, NULL included, though only a reservation that owes a
-- refund has one and no statement looks a row up by it: the constraint only guards the
-- uniqueness of refund ids. A partial unique index keeps that guard and indexes only the rows
-- with a refund, one index entry fewer per state change for every other. (SQLite updates
-- only the indexes whose columns change, so its schema keeps the column constraint.)
-- The other fifteen indexes each serve a statement's plan: a List shape's walk (8,
-- `tests/store/plans.rs`), idempotency (the (owner, holder, request_id) key), admission
-- (`reservations_live_by_holder`), the reaper and recovery (`reservations_open`,
-- `reservations_payment_work`), a payment's binding, retention (`reservations_finished`).
ALTER TABLE reservations DROP CONSTRAINT IF EXISTS reservations_refund_id_key;
CREATE UNIQUE INDEX IF NOT EXISTS reservations_refund_id
    ON reservations (refund_id) WHERE refund_id IS NOT NULL;
