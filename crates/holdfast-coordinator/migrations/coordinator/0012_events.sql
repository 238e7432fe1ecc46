-- The event log (SPEC 10), an outbox: triggers append an event in the transaction of every
-- change of a reservation (a state, an Extend, a payment recorded, a refund's state, an operator
-- action), so no write path can leave one out. Each event carries the reservation's columns as
-- the change left them (no token, no digest, no lease).
--
-- Numbering (store/events.rs): an event is inserted with `sequence` NULL; the sequencer numbers
-- committed events, in id order, in transactions that hold the `event_sequencer` row lock one
-- at a time. So numbers become visible in increasing order and a reader resuming after N never
-- skips an event that committed late (`id` is the insert order, used only by the sequencer).
CREATE TABLE events (
    id                    bigserial   PRIMARY KEY,
    sequence              bigint,
    event_id              uuid        NOT NULL DEFAULT gen_random_uuid(),
    type                  text        NOT NULL,
    occurred_at           timestamptz NOT NULL,
    from_queue            boolean     NOT NULL DEFAULT false,
    reservation_id        uuid        NOT NULL,
    request_id            text        NOT NULL,
    holder                text        NOT NULL,
    owner                 text        NOT NULL,
    state                 text        NOT NULL,
    release_outcome       text,
    ttl_ms                bigint      NOT NULL,
    created_at            timestamptz NOT NULL,
    expires_at            timestamptz NOT NULL,
    extensions_used       integer     NOT NULL,
    labels                jsonb       NOT NULL,
    rejection_participant text,
    rejection_resource    text,
    rejection_reason      text,
    late_payment_honored  boolean     NOT NULL,
    version               bigint      NOT NULL,
    payment_participant   text,
    payment_ref           text,
    payment_amount_minor  bigint,
    payment_currency      text,
    refund_id             uuid,
    refund_state          text,
    refund_reason         text,
    refund_failure        text,
    generation            integer     NOT NULL
);
-- Few indexes, each written once per event: numbered events by number (partial: an insert does
-- not touch it), unnumbered ones for the sequencer. Retention and lag walk `sequence` (times
-- follow it), so no index on time.
CREATE UNIQUE INDEX events_by_sequence ON events (sequence) WHERE sequence IS NOT NULL;
CREATE INDEX events_unnumbered ON events (id) WHERE sequence IS NULL;

-- The last number handed out. Its row lock serialises sequencers; it never goes back, even
-- when retention empties the log.
CREATE TABLE event_sequencer (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    last bigint  NOT NULL CHECK (last >= 0)
);
INSERT INTO event_sequencer (id, last) VALUES (true, 0);

-- Each sink's durable cursor and delivery lease (one replica delivers at a time).
CREATE TABLE event_sinks (
    name              text        PRIMARY KEY,
    delivered_through bigint      NOT NULL DEFAULT 0,
    lease_owner       uuid,
    lease_until       timestamptz,
    failing_since     timestamptz,
    paused            boolean     NOT NULL DEFAULT false,
    last_error        text
);

-- Appends one event for reservation row `r`. A SQL function: `clock_timestamp()` resolves
-- through the caller's search_path, so a test-mode pool's movable clock applies.
CREATE FUNCTION holdfast_append_event(r reservations, event_type text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO events (type, occurred_at, reservation_id, request_id, holder, owner, state,
                        release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels,
                        rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    VALUES (event_type, clock_timestamp(), r.id, r.request_id, r.holder, r.owner, r.state,
            r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels,
            r.rejection_participant, r.rejection_resource, r.rejection_reason,
            r.late_payment_honored, r.version, r.payment_participant, r.payment_ref,
            r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state,
            r.refund_reason, r.refund_failure, r.generation)
$$;

-- A reservation written: a payment recorded, then the state it entered, an Extend, a refund's
-- new state, in that order.
CREATE FUNCTION holdfast_reservation_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM holdfast_append_event(NEW, 'RESERVATION_' || NEW.state);
        RETURN NULL;
    END IF;
    IF NEW.payment_ref IS NOT NULL AND OLD.payment_ref IS NULL THEN
        PERFORM holdfast_append_event(NEW, 'PAYMENT_RECORDED');
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        PERFORM holdfast_append_event(NEW, 'RESERVATION_' || NEW.state);
    END IF;
    IF NEW.extensions_used > OLD.extensions_used THEN
        PERFORM holdfast_append_event(NEW, 'RESERVATION_EXTENDED');
    END IF;
    IF NEW.refund_state IS DISTINCT FROM OLD.refund_state AND NEW.refund_state IS NOT NULL THEN
        PERFORM holdfast_append_event(NEW, 'REFUND_' || NEW.refund_state);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER reservations_recorded_event AFTER INSERT ON reservations
    FOR EACH ROW EXECUTE FUNCTION holdfast_reservation_events();
CREATE TRIGGER reservations_changed_event AFTER UPDATE ON reservations
    FOR EACH ROW WHEN (NEW.state IS DISTINCT FROM OLD.state
                       OR NEW.extensions_used IS DISTINCT FROM OLD.extensions_used
                       OR NEW.payment_ref IS DISTINCT FROM OLD.payment_ref
                       OR NEW.refund_state IS DISTINCT FROM OLD.refund_state)
    EXECUTE FUNCTION holdfast_reservation_events();

-- A further payment (always refunded): recorded with its refund PENDING, then its refund's
-- state changes. The event carries the reservation it was cited for.
CREATE FUNCTION holdfast_extra_payment_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r reservations;
BEGIN
    SELECT * INTO r FROM reservations WHERE id = NEW.reservation_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM holdfast_append_event(r, 'PAYMENT_RECORDED');
        PERFORM holdfast_append_event(r, 'REFUND_' || NEW.refund_state);
    ELSIF NEW.refund_state IS DISTINCT FROM OLD.refund_state THEN
        PERFORM holdfast_append_event(r, 'REFUND_' || NEW.refund_state);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER extra_payments_recorded_event AFTER INSERT ON extra_payments
    FOR EACH ROW EXECUTE FUNCTION holdfast_extra_payment_events();
CREATE TRIGGER extra_payments_changed_event AFTER UPDATE ON extra_payments
    FOR EACH ROW WHEN (NEW.refund_state IS DISTINCT FROM OLD.refund_state)
    EXECUTE FUNCTION holdfast_extra_payment_events();

-- An operator's action on a reservation (tcc.v1.Admin, audited).
CREATE FUNCTION holdfast_admin_action_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r reservations;
BEGIN
    SELECT * INTO r FROM reservations WHERE id = NEW.reservation_id;
    IF FOUND THEN
        PERFORM holdfast_append_event(r, 'ADMIN_ACTION');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER admin_audit_event AFTER INSERT ON admin_audit
    FOR EACH ROW EXECUTE FUNCTION holdfast_admin_action_event();
