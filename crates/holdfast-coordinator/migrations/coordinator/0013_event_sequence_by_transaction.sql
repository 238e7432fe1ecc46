-- Events are numbered at insert, by their transaction (was: inserted unnumbered, then numbered
-- by a sequencer's update; that second write per event cost a quarter of the throughput).
--
-- sequence = (transaction id << 20) | (the event's ordinal in its transaction, from 1). A reader
-- reads only events below the horizon (`holdfast_event_horizon()`, the oldest transaction of
-- this database still running, shifted alike): every transaction of this database with a
-- smaller id has ended, so no event can still appear below it, and every event of a
-- transaction still running (or not yet started) is above it. Readers therefore
-- never skip an event that commits late; they wait for it (store/events.rs). Numbers are
-- sparse, strictly increasing in the order readers receive them, and never handed out twice.

-- What the old sequencer left unnumbered (committed before this migration) is numbered as it
-- would have been: after its last number, in insert order.
UPDATE events e SET sequence = s.last + n.rank
FROM event_sequencer s,
     (SELECT id, row_number() OVER (ORDER BY id) AS rank FROM events WHERE sequence IS NULL) n
WHERE e.id = n.id;

DO $$
BEGIN
    IF (SELECT coalesce(max(sequence), 0) FROM events)
        >= (pg_current_xact_id()::text::bigint << 20) THEN
        RAISE EXCEPTION 'event sequences already reach past this transaction''s; cannot renumber';
    END IF;
END
$$;

DROP INDEX events_unnumbered;
DROP INDEX events_by_sequence;
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events DROP COLUMN id;
ALTER TABLE events ALTER COLUMN sequence SET NOT NULL;
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (sequence);
DROP TABLE event_sequencer;

-- The next event's sequence in the calling transaction. The ordinal is a transaction-local
-- setting (reset when the transaction ends; undone with a savepoint it was set under, as are
-- the rows that used it).
CREATE FUNCTION holdfast_next_event_sequence() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    ordinal bigint := coalesce(nullif(current_setting('holdfast.event_ordinal', true), ''), '0')::bigint + 1;
BEGIN
    IF ordinal > 1048575 THEN
        RAISE EXCEPTION 'one transaction appended more than 1048575 events';
    END IF;
    PERFORM set_config('holdfast.event_ordinal', ordinal::text, true);
    RETURN (pg_current_xact_id()::text::bigint << 20) | ordinal;
END
$$;

-- The first sequence a reader may not read yet: the oldest transaction of this database still
-- running when the reader's snapshot was taken (or the snapshot's xmax, past which every
-- transaction counts as running). Transaction ids are the server's: one running in another
-- database never appends here, so it does not hold readers back - when it is known to be
-- another database's (`pg_stat_get_activity`; a role that may not see other roles' sessions
-- sees no database for them, and waits for them as for its own).
CREATE FUNCTION holdfast_event_horizon() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(running) FROM pg_snapshot_xip(pg_current_snapshot()) AS running
         WHERE NOT EXISTS (
             SELECT 1 FROM pg_stat_get_activity(NULL) AS elsewhere
             WHERE elsewhere.backend_xid = xid(running)
               AND elsewhere.datid IS DISTINCT FROM
                   (SELECT oid FROM pg_database WHERE datname = current_database()))),
        pg_snapshot_xmax(pg_current_snapshot()))::text::bigint << 20
$$;

-- Appends one event for reservation row `r`, numbered. PL/pgSQL (was SQL): its INSERT is
-- planned once per session, where a SQL function called from a trigger was planned again in
-- every transaction. `clock_timestamp()` still resolves through the session's search_path
-- (a test-mode pool's movable clock), which a session never changes.
CREATE OR REPLACE FUNCTION holdfast_append_event(r reservations, event_type text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    VALUES (holdfast_next_event_sequence(), event_type, clock_timestamp(), r.id, r.request_id,
            r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at,
            r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource,
            r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant,
            r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id,
            r.refund_state, r.refund_reason, r.refund_failure, r.generation);
END
$$;
