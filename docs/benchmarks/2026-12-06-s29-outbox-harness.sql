-- Issue 46 design spike: the writes of n Reserve+Confirm lifecycles (INSERT TRYING, UPDATE HELD,
-- UPDATE CONFIRMING with a lease and a payment, UPDATE CONFIRMED), `batch` reservations per
-- statement as the group commit sends them, on
--   A : today's `reservations` (18 indexes) with the event triggers (0015),
--   A0: the same with the triggers off (the bench's `-without-events`),
--   B : a narrow live row (`b_live`: state, version, expiry, lease, payment; 4 indexes) beside a
--       row written once (`b_reservation`: who, what, labels, token digest; the List indexes),
--       and every transition one insert into the log (`b_events`) by the statement that makes it.
-- Run in a scratch database with the coordinator's migrations applied.
CREATE OR REPLACE FUNCTION mycpu() RETURNS bigint LANGUAGE sql AS $$
  SELECT split_part(s, ' ', 12)::bigint + split_part(s, ' ', 13)::bigint
  FROM (SELECT split_part(pg_read_file('/proc/self/stat'), ') ', 2) AS s) x $$;

CREATE TABLE IF NOT EXISTS b_reservation (
    id uuid PRIMARY KEY, request_id text NOT NULL, holder text NOT NULL, owner text NOT NULL,
    ttl_ms bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    labels jsonb NOT NULL DEFAULT '{}', token_digest bytea NOT NULL, token_key_id text,
    UNIQUE (owner, holder, request_id));
CREATE INDEX IF NOT EXISTS b_by_created ON b_reservation (created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS b_by_holder ON b_reservation (holder, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS b_by_owner ON b_reservation (owner, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS b_by_owner_holder ON b_reservation (owner, holder, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS b_by_request_id ON b_reservation (request_id, created_at DESC, id DESC);
CREATE TABLE IF NOT EXISTS b_live (
    id uuid PRIMARY KEY, state text NOT NULL, version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL, extensions_used int NOT NULL DEFAULT 0,
    release_outcome text, lease_owner uuid, lease_until timestamptz, next_attempt_at timestamptz,
    payment_participant text, payment_ref text, payment_amount_minor bigint, payment_currency text,
    refund_id uuid, refund_state text, generation int NOT NULL DEFAULT 0) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS b_open ON b_live (state, expires_at) WHERE state IN ('TRYING','HELD','CONFIRMING','CANCELLING');
CREATE INDEX IF NOT EXISTS b_by_state ON b_live (state, created_at DESC, id DESC);
CREATE UNIQUE INDEX IF NOT EXISTS b_payment_binding ON b_live (payment_participant, payment_ref) WHERE payment_ref IS NOT NULL;
CREATE TABLE IF NOT EXISTS b_events (
    sequence bigint PRIMARY KEY, event_id uuid NOT NULL DEFAULT gen_random_uuid(), type text NOT NULL,
    occurred_at timestamptz NOT NULL, reservation_id uuid NOT NULL, state text NOT NULL,
    version bigint NOT NULL, expires_at timestamptz NOT NULL, extensions_used int NOT NULL,
    release_outcome text, payment_participant text, payment_ref text, payment_amount_minor bigint,
    payment_currency text, refund_id uuid, refund_state text, generation int NOT NULL);

CREATE OR REPLACE PROCEDURE life_a(n int, batch int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[];
BEGIN
  FOR j IN 1..n / batch LOOP
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, batch));
    INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms, expires_at)
    SELECT i, i::text, 'h', 'shop', 'TRYING', sha256(uuid_send(i)), 600000, clock_timestamp() + interval '10 minutes'
    FROM unnest(ids) i;
    COMMIT;
    UPDATE reservations SET state = 'HELD', version = version + 1, updated_at = clock_timestamp() WHERE id = ANY(ids);
    COMMIT;
    UPDATE reservations SET state = 'CONFIRMING', version = version + 1, updated_at = clock_timestamp(),
           lease_owner = ids[1], lease_until = clock_timestamp() + interval '30 s',
           payment_participant = 'payments', payment_ref = id::text, payment_amount_minor = 100, payment_currency = 'EUR'
    WHERE id = ANY(ids);
    COMMIT;
    UPDATE reservations SET state = 'CONFIRMED', version = version + 1, updated_at = clock_timestamp(),
           lease_owner = NULL, lease_until = NULL WHERE id = ANY(ids);
    COMMIT;
  END LOOP;
END $$;

CREATE OR REPLACE PROCEDURE life_b(n int, batch int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[];
BEGIN
  FOR j IN 1..n / batch LOOP
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, batch));
    WITH r AS (INSERT INTO b_reservation (id, request_id, holder, owner, token_digest, ttl_ms)
               SELECT i, i::text, 'h', 'shop', sha256(uuid_send(i)), 600000 FROM unnest(ids) i
               RETURNING id, created_at),
         l AS (INSERT INTO b_live (id, state, created_at, expires_at)
               SELECT id, 'TRYING', created_at, clock_timestamp() + interval '10 minutes' FROM r
               RETURNING *)
    INSERT INTO b_events (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_TRYING', clock_timestamp(), id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation FROM l;
    COMMIT;
    WITH l AS (UPDATE b_live SET state = 'HELD', version = version + 1, updated_at = clock_timestamp()
               WHERE id = ANY(ids) RETURNING *)
    INSERT INTO b_events (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_HELD', clock_timestamp(), id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation FROM l;
    COMMIT;
    WITH l AS (UPDATE b_live SET state = 'CONFIRMING', version = version + 1, updated_at = clock_timestamp(),
                   lease_owner = ids[1], lease_until = clock_timestamp() + interval '30 s',
                   payment_participant = 'payments', payment_ref = id::text, payment_amount_minor = 100, payment_currency = 'EUR'
               WHERE id = ANY(ids) RETURNING *)
    INSERT INTO b_events (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation)
    SELECT holdfast_next_event_sequence(), t, clock_timestamp(), id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation
    FROM l, unnest(ARRAY['PAYMENT_RECORDED', 'RESERVATION_CONFIRMING']) t;
    COMMIT;
    WITH l AS (UPDATE b_live SET state = 'CONFIRMED', version = version + 1, updated_at = clock_timestamp(),
                   lease_owner = NULL, lease_until = NULL WHERE id = ANY(ids) RETURNING *)
    INSERT INTO b_events (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_CONFIRMED', clock_timestamp(), id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation FROM l;
    COMMIT;
  END LOOP;
END $$;
