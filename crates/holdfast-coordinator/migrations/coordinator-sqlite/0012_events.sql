-- The event log (SPEC 10) on SQLite, the schema of migrations/coordinator/0012_events.sql in this
-- dialect: triggers append an event in the transaction of every change of a reservation, so no
-- write path can leave one out; each carries the reservation's columns as the change left them
-- (no token, no digest, no lease). One writer commits in order, so `sequence` is taken at insert;
-- AUTOINCREMENT never hands a number out twice, even after retention empties the log.
-- A migration that rebuilds `reservations`, `extra_payments` or `admin_audit` must recreate
-- their triggers below.
CREATE TABLE events (
    sequence              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id              BLOB    NOT NULL CHECK (length(event_id) = 16),
    type                  TEXT    NOT NULL,
    occurred_at           INTEGER NOT NULL,
    from_queue            INTEGER NOT NULL DEFAULT 0 CHECK (from_queue IN (0, 1)),
    reservation_id        BLOB    NOT NULL,
    request_id            TEXT    NOT NULL,
    holder                TEXT    NOT NULL,
    owner                 TEXT    NOT NULL,
    state                 TEXT    NOT NULL,
    release_outcome       TEXT,
    ttl_ms                INTEGER NOT NULL,
    created_at            INTEGER NOT NULL,
    expires_at            INTEGER NOT NULL,
    extensions_used       INTEGER NOT NULL,
    labels                TEXT    NOT NULL,
    rejection_participant TEXT,
    rejection_resource    TEXT,
    rejection_reason      TEXT,
    late_payment_honored  INTEGER NOT NULL,
    version               INTEGER NOT NULL,
    payment_participant   TEXT,
    payment_ref           TEXT,
    payment_amount_minor  INTEGER,
    payment_currency      TEXT,
    refund_id             BLOB,
    refund_state          TEXT,
    refund_reason         TEXT,
    refund_failure        TEXT,
    generation            INTEGER NOT NULL
) STRICT;

-- Each sink's durable cursor and delivery lease (one replica delivers at a time).
CREATE TABLE event_sinks (
    name              TEXT    PRIMARY KEY,
    delivered_through INTEGER NOT NULL DEFAULT 0,
    lease_owner       BLOB,
    lease_until       INTEGER,
    failing_since     INTEGER,
    paused            INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    last_error        TEXT
) STRICT;

CREATE TRIGGER reservations_recorded_event AFTER INSERT ON reservations
BEGIN
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'RESERVATION_' || NEW.state, (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           NEW.id, NEW.request_id, NEW.holder, NEW.owner, NEW.state, NEW.release_outcome, NEW.ttl_ms, NEW.created_at, NEW.expires_at, NEW.extensions_used, NEW.labels, NEW.rejection_participant, NEW.rejection_resource, NEW.rejection_reason, NEW.late_payment_honored, NEW.version, NEW.payment_participant, NEW.payment_ref, NEW.payment_amount_minor, NEW.payment_currency, NEW.refund_id, NEW.refund_state, NEW.refund_reason, NEW.refund_failure, NEW.generation;
END;

-- A reservation written: a payment recorded, then the state it entered, an Extend, a refund's
-- new state, in that order.
CREATE TRIGGER reservations_changed_event AFTER UPDATE ON reservations
WHEN NEW.state IS NOT OLD.state OR NEW.extensions_used IS NOT OLD.extensions_used
  OR NEW.payment_ref IS NOT OLD.payment_ref OR NEW.refund_state IS NOT OLD.refund_state
BEGIN
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'PAYMENT_RECORDED', (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           NEW.id, NEW.request_id, NEW.holder, NEW.owner, NEW.state, NEW.release_outcome, NEW.ttl_ms, NEW.created_at, NEW.expires_at, NEW.extensions_used, NEW.labels, NEW.rejection_participant, NEW.rejection_resource, NEW.rejection_reason, NEW.late_payment_honored, NEW.version, NEW.payment_participant, NEW.payment_ref, NEW.payment_amount_minor, NEW.payment_currency, NEW.refund_id, NEW.refund_state, NEW.refund_reason, NEW.refund_failure, NEW.generation
    WHERE NEW.payment_ref IS NOT NULL AND OLD.payment_ref IS NULL;
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'RESERVATION_' || NEW.state, (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           NEW.id, NEW.request_id, NEW.holder, NEW.owner, NEW.state, NEW.release_outcome, NEW.ttl_ms, NEW.created_at, NEW.expires_at, NEW.extensions_used, NEW.labels, NEW.rejection_participant, NEW.rejection_resource, NEW.rejection_reason, NEW.late_payment_honored, NEW.version, NEW.payment_participant, NEW.payment_ref, NEW.payment_amount_minor, NEW.payment_currency, NEW.refund_id, NEW.refund_state, NEW.refund_reason, NEW.refund_failure, NEW.generation
    WHERE NEW.state IS NOT OLD.state;
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'RESERVATION_EXTENDED', (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           NEW.id, NEW.request_id, NEW.holder, NEW.owner, NEW.state, NEW.release_outcome, NEW.ttl_ms, NEW.created_at, NEW.expires_at, NEW.extensions_used, NEW.labels, NEW.rejection_participant, NEW.rejection_resource, NEW.rejection_reason, NEW.late_payment_honored, NEW.version, NEW.payment_participant, NEW.payment_ref, NEW.payment_amount_minor, NEW.payment_currency, NEW.refund_id, NEW.refund_state, NEW.refund_reason, NEW.refund_failure, NEW.generation
    WHERE NEW.extensions_used > OLD.extensions_used;
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'REFUND_' || NEW.refund_state, (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           NEW.id, NEW.request_id, NEW.holder, NEW.owner, NEW.state, NEW.release_outcome, NEW.ttl_ms, NEW.created_at, NEW.expires_at, NEW.extensions_used, NEW.labels, NEW.rejection_participant, NEW.rejection_resource, NEW.rejection_reason, NEW.late_payment_honored, NEW.version, NEW.payment_participant, NEW.payment_ref, NEW.payment_amount_minor, NEW.payment_currency, NEW.refund_id, NEW.refund_state, NEW.refund_reason, NEW.refund_failure, NEW.generation
    WHERE NEW.refund_state IS NOT OLD.refund_state AND NEW.refund_state IS NOT NULL;
END;

-- A further payment (always refunded): recorded with its refund PENDING, then its refund's
-- state changes. The event carries the reservation it was cited for.
CREATE TRIGGER extra_payments_recorded_event AFTER INSERT ON extra_payments
BEGIN
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'PAYMENT_RECORDED', (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM reservations r WHERE r.id = NEW.reservation_id;
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'REFUND_' || NEW.refund_state, (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM reservations r WHERE r.id = NEW.reservation_id;
END;
CREATE TRIGGER extra_payments_changed_event AFTER UPDATE ON extra_payments
WHEN NEW.refund_state IS NOT OLD.refund_state
BEGIN
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'REFUND_' || NEW.refund_state, (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM reservations r WHERE r.id = NEW.reservation_id;
END;

-- An operator's action on a reservation (tcc.v1.Admin, audited).
CREATE TRIGGER admin_audit_event AFTER INSERT ON admin_audit
WHEN NEW.reservation_id IS NOT NULL
BEGIN
    INSERT INTO events (event_id, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation)
    SELECT (SELECT unhex(substr(h, 1, 12) || '4' || substr(h, 14, 3) || substr('89AB', 1 + abs(random()) % 4, 1) || substr(h, 18, 15)) FROM (SELECT hex(randomblob(16)) AS h)),
           'ADMIN_ACTION', (SELECT CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000 + offset_us FROM holdfast_clock_offset WHERE id = 0),
           r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM reservations r WHERE r.id = NEW.reservation_id;
END;
