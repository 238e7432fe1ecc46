-- A reservation's events appended once per statement (was: once per row, through two PL/pgSQL
-- calls per event). The events and their order are those of 0012_events.sql; what changed is the
-- cost. Per event the row triggers ran a `PERFORM` (a query of its own), a call of
-- holdfast_append_event with the row, an INSERT's executor start, and a PL/pgSQL numbering
-- function whose expressions are compiled again in every transaction (PL/pgSQL keeps simple
-- expressions per transaction). Now each INSERT or UPDATE of `reservations` fires one statement
-- trigger whose body is a single INSERT ... SELECT over the statement's transition tables: one
-- executor start for every event of the statement (the group commit writes many reservations in
-- one statement), and the number taken by an SQL expression the planner inlines.
-- (docs/benchmarks/2026-12-06-s25-events-cost.md has the measurements.)

-- The next event's sequence in the calling transaction, `(transaction id << 20) | ordinal`
-- (0013_event_sequence_by_transaction.sql), the ordinal from 1 in a transaction-local setting
-- (undone with a savepoint it was set under, as are the rows that used it). SQL, one expression:
-- inlined where it is called, evaluated once per row, in the order the rows are inserted.
CREATE FUNCTION holdfast_event_ordinal_overflow() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'one transaction appended more than 1048575 events';
END
$$;

CREATE OR REPLACE FUNCTION holdfast_next_event_sequence() RETURNS bigint LANGUAGE sql AS $$
    SELECT (pg_current_xact_id()::text::bigint << 20)
         | set_config('holdfast.event_ordinal',
               CASE WHEN coalesce(nullif(current_setting('holdfast.event_ordinal', true), ''),
                                  '0')::bigint < 1048575
                    THEN (coalesce(nullif(current_setting('holdfast.event_ordinal', true), ''),
                                   '0')::bigint + 1)::text
                    ELSE holdfast_event_ordinal_overflow() END,
               true)::bigint
$$;

DROP TRIGGER reservations_recorded_event ON reservations;
DROP TRIGGER reservations_changed_event ON reservations;
DROP FUNCTION holdfast_reservation_events();

-- Reservations inserted: each one's first state (RESERVATION_TRYING, ..._REJECTED, ...).
CREATE FUNCTION holdfast_reservations_recorded_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_' || r.state, clock_timestamp(), r.id,
           r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at,
           r.expires_at, r.extensions_used, r.labels, r.rejection_participant,
           r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version,
           r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency,
           r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM recorded r;
    RETURN NULL;
END
$$;

-- Reservations updated: for each, a payment recorded, then the state it entered, an Extend, a
-- refund's new state, in that order (the order of the VALUES list; a new kind of change is one
-- more line there). A row whose update changed none of these appends nothing.
CREATE FUNCTION holdfast_reservations_changed_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT holdfast_next_event_sequence(), change.type, clock_timestamp(), r.id, r.request_id,
           r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at,
           r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource,
           r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant,
           r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id,
           r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM changed r
    JOIN was ON was.id = r.id
    CROSS JOIN LATERAL (VALUES
        ('PAYMENT_RECORDED', r.payment_ref IS NOT NULL AND was.payment_ref IS NULL),
        ('RESERVATION_' || r.state, r.state IS DISTINCT FROM was.state),
        ('RESERVATION_EXTENDED', r.extensions_used > was.extensions_used),
        ('REFUND_' || r.refund_state,
         r.refund_state IS DISTINCT FROM was.refund_state AND r.refund_state IS NOT NULL)
    ) AS change(type, due)
    WHERE change.due;
    RETURN NULL;
END
$$;

CREATE TRIGGER reservations_recorded_events AFTER INSERT ON reservations
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION holdfast_reservations_recorded_events();
CREATE TRIGGER reservations_changed_events AFTER UPDATE ON reservations
    REFERENCING OLD TABLE AS was NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION holdfast_reservations_changed_events();
