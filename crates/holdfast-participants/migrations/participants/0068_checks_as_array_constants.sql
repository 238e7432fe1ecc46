-- The reference participants' CHECK constraints' lists of allowed values as one array constant
-- (the barrier's own: `0091`, which says why: PostgreSQL plans a table's CHECK expressions again
-- in every statement that writes it, and an `ARRAY[...]` of literals costs an executor run each
-- time). The rules are the same, value for value; NOT VALID because every existing row was
-- checked by the equal constraint it replaces.
ALTER TABLE seat
    DROP CONSTRAINT seat_state_check,
    ADD CONSTRAINT seat_state_check CHECK (state = ANY (
        '{available,held,confirmed}'::text[]
    )) NOT VALID;

ALTER TABLE stock_hold
    DROP CONSTRAINT stock_hold_state_check,
    ADD CONSTRAINT stock_hold_state_check CHECK (state = ANY (
        '{held,confirmed,cancelled}'::text[]
    )) NOT VALID;

ALTER TABLE slot_hold
    DROP CONSTRAINT slot_hold_state_check,
    ADD CONSTRAINT slot_hold_state_check CHECK (state = ANY (
        '{held,confirmed,cancelled}'::text[]
    )) NOT VALID;

ALTER TABLE authorisation
    DROP CONSTRAINT authorisation_state_check,
    ADD CONSTRAINT authorisation_state_check CHECK (state = ANY (
        '{authorised,captured,voided}'::text[]
    )) NOT VALID;
