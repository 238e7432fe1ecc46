-- The barrier's CHECK constraints' lists of allowed values as one array constant,
-- `col = ANY ('{a,b}'::text[])`, instead of `col IN ('a', 'b')` (stored as an `ARRAY['a', 'b']`
-- of separate literals). PostgreSQL plans a table's CHECK expressions again, from their stored
-- text, in every statement that writes the table, and folds an `ARRAY[...]` of literals by
-- running it through the executor each time: a fixed cost on every Try, Confirm and Cancel's
-- barrier write. The rules are the same, value for value.
--
-- Replaced under their own names, NOT VALID: every existing row was checked by the constraint it
-- replaces, which allowed exactly the same values, so the table is not scanned again under the
-- migration's lock. New and updated rows are checked as before.
ALTER TABLE tcc_barrier
    DROP CONSTRAINT tcc_barrier_state_check,
    ADD CONSTRAINT tcc_barrier_state_check CHECK (state = ANY (
        '{trying,held,rejected,confirmed,cancelled,hold_lost}'::text[]
    )) NOT VALID,
    DROP CONSTRAINT tcc_barrier_try_answer_check,
    ADD CONSTRAINT tcc_barrier_try_answer_check CHECK (try_answer = ANY (
        '{held,rejected}'::text[]
    )) NOT VALID;
