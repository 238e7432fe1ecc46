-- Session 30 harness (issue 46): what a Reserve+Confirm's writes of `reservations` cost on one
-- PostgreSQL backend, by the table's CHECK constraints and by its number of indexes. Load into a
-- scratch database holding the coordinator's migrations 0001-0016 and the s29 harness
-- (2026-12-06-s29-outbox-harness.sql: `mycpu()`, `life_a`, `life_b` and their tables); run with
-- 2026-12-06-s30-writes-run.sh. `life_a`'s statements on a copy of `reservations`' columns (no
-- trigger), `x_<v>`, with:
--   i18 : the 18 indexes of `reservations` and its CHECKs as 0001-0016 wrote them (`IN (...)`)
--   i12 : without the six that hold no `state` (by_created, by_holder, by_owner,
--         by_owner_holder, by_request_id and the (owner, holder, request_id) key)
--   i9  : i12 without the three partial indexes a Reserve+Confirm never enters
--         (payment_work, queue_wait, refund_id)
--   i7  : i9 without by_holder_state and by_owner_holder_state
--   <v>a : <v>, its CHECKs' value lists as one array constant (as migration 0017 writes them)
--   <v>n : <v> without CHECK constraints
CREATE OR REPLACE PROCEDURE s30_table(v text) LANGUAGE plpgsql AS $$
DECLARE t text := 'x_' || v; idx text := regexp_replace(v, '[an]$', '');
BEGIN
  EXECUTE format('DROP TABLE IF EXISTS %I', t);
  EXECUTE format('CREATE TABLE %I (LIKE reservations INCLUDING DEFAULTS)', t);
  EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id)', t);
  -- i7: the indexes with `state` in their key or predicate, and the payment binding
  EXECUTE format('CREATE INDEX ON %I (state, expires_at) WHERE state IN (''TRYING'', ''HELD'', ''CONFIRMING'', ''CANCELLING'')', t);
  EXECUTE format('CREATE INDEX ON %I (updated_at) WHERE state IN (''CONFIRMED'', ''CANCELLED'', ''EXPIRED'', ''REJECTED'', ''FAILED'')', t);
  EXECUTE format('CREATE INDEX ON %I (owner, holder) WHERE state IN (''TRYING'', ''HELD'', ''QUEUED'')', t);
  EXECUTE format('CREATE UNIQUE INDEX ON %I (payment_participant, payment_ref) WHERE payment_ref IS NOT NULL', t);
  EXECUTE format('CREATE INDEX ON %I (state, created_at DESC, id DESC)', t);
  EXECUTE format('CREATE INDEX ON %I (owner, state, created_at DESC, id DESC)', t);
  IF idx <> 'i7' THEN
    EXECUTE format('CREATE INDEX ON %I (holder, state, created_at DESC, id DESC)', t);
    EXECUTE format('CREATE INDEX ON %I (owner, holder, state, created_at DESC, id DESC)', t);
  END IF;
  IF idx NOT IN ('i7', 'i9') THEN
    EXECUTE format('CREATE INDEX ON %I (next_attempt_at) WHERE refund_state = ''PENDING'' OR state = ''EXPIRED'' AND payment_ref IS NOT NULL AND refund_id IS NULL', t);
    EXECUTE format('CREATE INDEX ON %I (queue_until) WHERE state = ''QUEUED''', t);
    EXECUTE format('CREATE UNIQUE INDEX ON %I (refund_id) WHERE refund_id IS NOT NULL', t);
  END IF;
  IF idx = 'i18' THEN
    EXECUTE format('CREATE INDEX ON %I (created_at DESC, id DESC)', t);
    EXECUTE format('CREATE INDEX ON %I (holder, created_at DESC, id DESC)', t);
    EXECUTE format('CREATE INDEX ON %I (owner, created_at DESC, id DESC)', t);
    EXECUTE format('CREATE INDEX ON %I (owner, holder, created_at DESC, id DESC)', t);
    EXECUTE format('CREATE INDEX ON %I (request_id, created_at DESC, id DESC)', t);
    EXECUTE format('ALTER TABLE %I ADD UNIQUE (owner, holder, request_id)', t);
  END IF;
  IF v LIKE '%a' THEN
    EXECUTE format('ALTER TABLE %I ADD CHECK (ttl_ms > 0), ADD CHECK (length(token_digest) = 32), '
      'ADD CHECK (state = ANY (''{TRYING,HELD,CONFIRMING,CONFIRMED,CANCELLING,CANCELLED,EXPIRED,REJECTED,FAILED,QUEUED}''::text[])), '
      'ADD CHECK (release_outcome = ANY (''{CANCELLED,EXPIRED,REJECTED,FAILED,QUEUED}''::text[])), '
      'ADD CHECK (refund_state = ANY (''{PENDING,REFUNDED,FAILED}''::text[]))', t);
  ELSIF v NOT LIKE '%n' THEN
    EXECUTE format('ALTER TABLE %I ADD CHECK (ttl_ms > 0), ADD CHECK (length(token_digest) = 32), '
      'ADD CHECK (state IN (''TRYING'', ''HELD'', ''CONFIRMING'', ''CONFIRMED'', ''CANCELLING'', ''CANCELLED'', ''EXPIRED'', ''REJECTED'', ''FAILED'', ''QUEUED'')), '
      'ADD CHECK (release_outcome IN (''CANCELLED'', ''EXPIRED'', ''REJECTED'', ''FAILED'', ''QUEUED'')), '
      'ADD CHECK (refund_state IN (''PENDING'', ''REFUNDED'', ''FAILED''))', t);
  END IF;
  -- life_a's statements on this table, as life_<v>
  EXECUTE replace(replace(pg_get_functiondef('life_a'::regproc), 'reservations', t),
                  'life_a(', 'life_' || v || '(');
END $$;

-- The log's append, by trigger or by the statement that makes the change (session 29 measured
-- these under plpgsql's re-planned custom plans; the runner forces the generic plans the
-- coordinator's pooled statements get):
--   A1: life_a's statements on `reservations` with its event triggers off, each appending its
--       events itself (`WITH r AS (UPDATE ... RETURNING *) INSERT INTO events ... FROM r`)
--   B0: life_b's narrow live row (s29's `b_live`, `b_reservation`) without any event
--   BT: B0 with statement triggers on `b_live` appending to `b_events` as 0015's do
CREATE OR REPLACE PROCEDURE life_a1(n int, batch int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[];
BEGIN
  FOR j IN 1..n / batch LOOP
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, batch));
    WITH r AS (INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms, expires_at)
    SELECT i, i::text, 'h', 'shop', 'TRYING', sha256(uuid_send(i)), 600000, clock_timestamp() + interval '10 minutes'
    FROM unnest(ids) i RETURNING *)
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation) SELECT holdfast_next_event_sequence(), 'RESERVATION_TRYING', clock_timestamp(), r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation FROM r;
    COMMIT;
    WITH r AS (UPDATE reservations SET state = 'HELD', version = version + 1, updated_at = clock_timestamp() WHERE id = ANY(ids) RETURNING *)
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation) SELECT holdfast_next_event_sequence(), 'RESERVATION_HELD', clock_timestamp(), r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation FROM r;
    COMMIT;
    WITH r AS (UPDATE reservations SET state = 'CONFIRMING', version = version + 1, updated_at = clock_timestamp(),
           lease_owner = ids[1], lease_until = clock_timestamp() + interval '30 s',
           payment_participant = 'payments', payment_ref = id::text, payment_amount_minor = 100, payment_currency = 'EUR'
    WHERE id = ANY(ids) RETURNING *)
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation) SELECT holdfast_next_event_sequence(), t, clock_timestamp(), r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation FROM r, unnest(ARRAY['PAYMENT_RECORDED', 'RESERVATION_CONFIRMING']) t;
    COMMIT;
    WITH r AS (UPDATE reservations SET state = 'CONFIRMED', version = version + 1, updated_at = clock_timestamp(),
           lease_owner = NULL, lease_until = NULL WHERE id = ANY(ids) RETURNING *)
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner, state, release_outcome, ttl_ms, created_at, expires_at, extensions_used, labels, rejection_participant, rejection_resource, rejection_reason, late_payment_honored, version, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, refund_reason, refund_failure, generation) SELECT holdfast_next_event_sequence(), 'RESERVATION_CONFIRMED', clock_timestamp(), r.id, r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at, r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation FROM r;
    COMMIT;
  END LOOP;
END $$;
CREATE OR REPLACE PROCEDURE life_b0(n int, batch int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[];
BEGIN
  FOR j IN 1..n / batch LOOP
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, batch));
    WITH r AS (INSERT INTO b_reservation (id, request_id, holder, owner, token_digest, ttl_ms)
               SELECT i, i::text, 'h', 'shop', sha256(uuid_send(i)), 600000 FROM unnest(ids) i
               RETURNING id, created_at)
    INSERT INTO b_live (id, state, created_at, expires_at)
               SELECT id, 'TRYING', created_at, clock_timestamp() + interval '10 minutes' FROM r;
    COMMIT;
    UPDATE b_live SET state = 'HELD', version = version + 1, updated_at = clock_timestamp() WHERE id = ANY(ids);
    COMMIT;
    UPDATE b_live SET state = 'CONFIRMING', version = version + 1, updated_at = clock_timestamp(),
                   lease_owner = ids[1], lease_until = clock_timestamp() + interval '30 s',
                   payment_participant = 'payments', payment_ref = id::text, payment_amount_minor = 100, payment_currency = 'EUR'
               WHERE id = ANY(ids);
    COMMIT;
    UPDATE b_live SET state = 'CONFIRMED', version = version + 1, updated_at = clock_timestamp(),
                   lease_owner = NULL, lease_until = NULL WHERE id = ANY(ids);
    COMMIT;
  END LOOP;
END $$;
CREATE OR REPLACE FUNCTION b_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO b_events (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation)
  SELECT holdfast_next_event_sequence(), 'RESERVATION_' || r.state, clock_timestamp(), id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation FROM recorded r;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION b_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO b_events (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, release_outcome, payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id, refund_state, generation)
  SELECT holdfast_next_event_sequence(), change.type, clock_timestamp(), r.id, r.state, r.version, r.expires_at, r.extensions_used, r.release_outcome, r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id, r.refund_state, r.generation
  FROM changed r JOIN was ON was.id = r.id
  CROSS JOIN LATERAL (VALUES
        ('PAYMENT_RECORDED', r.payment_ref IS NOT NULL AND was.payment_ref IS NULL),
        ('RESERVATION_' || r.state, r.state IS DISTINCT FROM was.state),
        ('RESERVATION_EXTENDED', r.extensions_used > was.extensions_used),
        ('REFUND_' || r.refund_state, r.refund_state IS DISTINCT FROM was.refund_state AND r.refund_state IS NOT NULL)
    ) AS change(type, due)
  WHERE change.due;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS b_recorded ON b_live; DROP TRIGGER IF EXISTS b_changed ON b_live;
CREATE TRIGGER b_recorded AFTER INSERT ON b_live REFERENCING NEW TABLE AS recorded FOR EACH STATEMENT EXECUTE FUNCTION b_recorded();
CREATE TRIGGER b_changed AFTER UPDATE ON b_live REFERENCING OLD TABLE AS was NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION b_changed();

-- ca: design C for issue 46 (the note's last measurement)
CALL s30_table('i12a');
DROP TABLE IF EXISTS x_ca, x_ca_listed;
CREATE TABLE x_ca (LIKE x_i12a INCLUDING ALL);
CREATE TABLE x_ca_listed (id uuid PRIMARY KEY, owner text NOT NULL, holder text NOT NULL,
    request_id text NOT NULL, created_at timestamptz NOT NULL, UNIQUE (owner, holder, request_id));
CREATE INDEX ON x_ca_listed (created_at DESC, id DESC);
CREATE INDEX ON x_ca_listed (holder, created_at DESC, id DESC);
CREATE INDEX ON x_ca_listed (owner, created_at DESC, id DESC);
CREATE INDEX ON x_ca_listed (owner, holder, created_at DESC, id DESC);
CREATE INDEX ON x_ca_listed (request_id, created_at DESC, id DESC);
CREATE OR REPLACE PROCEDURE life_ca(n int, batch int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[];
BEGIN
  FOR j IN 1..n / batch LOOP
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, batch));
    WITH r AS (INSERT INTO x_ca (id, request_id, holder, owner, state, token_digest, ttl_ms, expires_at)
    SELECT i, i::text, 'h', 'shop', 'TRYING', sha256(uuid_send(i)), 600000, clock_timestamp() + interval '10 minutes'
    FROM unnest(ids) i RETURNING id, owner, holder, request_id, created_at)
    INSERT INTO x_ca_listed SELECT id, owner, holder, request_id, created_at FROM r;
    COMMIT;
    UPDATE x_ca SET state = 'HELD', version = version + 1, updated_at = clock_timestamp() WHERE id = ANY(ids);
    COMMIT;
    UPDATE x_ca SET state = 'CONFIRMING', version = version + 1, updated_at = clock_timestamp(),
           lease_owner = ids[1], lease_until = clock_timestamp() + interval '30 s',
           payment_participant = 'payments', payment_ref = id::text, payment_amount_minor = 100, payment_currency = 'EUR'
    WHERE id = ANY(ids);
    COMMIT;
    UPDATE x_ca SET state = 'CONFIRMED', version = version + 1, updated_at = clock_timestamp(),
           lease_owner = NULL, lease_until = NULL WHERE id = ANY(ids);
    COMMIT;
  END LOOP;
END $$;

-- D0: s29's narrow live row with i7's seven indexes (owner and holder copied onto it), no
-- events: against i7 (the same indexes on reservations' full columns), what the row's width costs
DROP TABLE IF EXISTS d_live;
CREATE TABLE d_live (LIKE b_live INCLUDING ALL) WITH (fillfactor = 70);
ALTER TABLE d_live ADD COLUMN owner text NOT NULL DEFAULT '', ADD COLUMN holder text NOT NULL DEFAULT '';
CREATE INDEX ON d_live (owner, state, created_at DESC, id DESC);
CREATE INDEX ON d_live (owner, holder) WHERE state IN ('TRYING','HELD','QUEUED');
CREATE INDEX ON d_live (updated_at) WHERE state IN ('CONFIRMED','CANCELLED','EXPIRED','REJECTED','FAILED');
CREATE OR REPLACE PROCEDURE life_d0(n int, batch int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[];
BEGIN
  FOR j IN 1..n / batch LOOP
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, batch));
    WITH r AS (INSERT INTO b_reservation (id, request_id, holder, owner, token_digest, ttl_ms)
               SELECT i, i::text, 'h', 'shop', sha256(uuid_send(i)), 600000 FROM unnest(ids) i
               RETURNING id, created_at, owner, holder)
    INSERT INTO d_live (id, state, created_at, expires_at, owner, holder)
               SELECT id, 'TRYING', created_at, clock_timestamp() + interval '10 minutes', owner, holder FROM r;
    COMMIT;
    UPDATE d_live SET state = 'HELD', version = version + 1, updated_at = clock_timestamp() WHERE id = ANY(ids);
    COMMIT;
    UPDATE d_live SET state = 'CONFIRMING', version = version + 1, updated_at = clock_timestamp(),
                   lease_owner = ids[1], lease_until = clock_timestamp() + interval '30 s',
                   payment_participant = 'payments', payment_ref = id::text, payment_amount_minor = 100, payment_currency = 'EUR'
               WHERE id = ANY(ids);
    COMMIT;
    UPDATE d_live SET state = 'CONFIRMED', version = version + 1, updated_at = clock_timestamp(),
                   lease_owner = NULL, lease_until = NULL WHERE id = ANY(ids);
    COMMIT;
  END LOOP;
END $$;
