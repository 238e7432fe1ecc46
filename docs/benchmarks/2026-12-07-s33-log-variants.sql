-- Session 33 (issues 42 and 46): variants of the event log's trigger on `reservations`, for
-- 2026-12-07-s33-log-callgrind.sh (instructions per Reserve+Confirm lifecycle of the s29/s30
-- harness's `life_a`, counted by callgrind on a private PostgreSQL). Load after the
-- coordinator's migrations and 2026-12-06-s29-outbox-harness.sql,
-- 2026-12-06-s30-writes-harness.sql. `CALL use_log('<v>')` puts variant <v>'s triggers on:
--   A0  no trigger (the `-without-events` rows)
--   A   today's (0015: NEW joined to OLD, LATERAL VALUES of the four kinds of change)
--   A1  no trigger; `life_a1` appends each statement's events itself (s30's)
--   AN  a lower bound, wrong on purpose: NEW alone, one state event per row (no OLD table)
--   AO  AN's body with the OLD table captured too (what capturing it costs)
--   AJ  NEW joined to OLD, one state event per row (no LATERAL)
--   AX  today's, numbered once per statement (row_number() and one set_config)
--   AP  today's, the kinds of change as unnest() of an array (ProjectSet, no nested loop)
--   ANP today's into a copy of `events` without its primary key
--   ANR today's into a narrow event row (11 columns and the key)
-- lower bound: NEW only, one event per row
CREATE OR REPLACE FUNCTION v_an_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_' || r.state, clock_timestamp(), r.id, r.request_id,
           r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at,
           r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource,
           r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant,
           r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id,
           r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM changed r;
    RETURN NULL;
END $$;
-- AX: numbering once per statement
CREATE OR REPLACE FUNCTION v_ax_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE base bigint; n bigint; ignored text;
BEGIN
    base := (pg_current_xact_id()::text::bigint << 20)
          | coalesce(nullif(current_setting('holdfast.event_ordinal', true), ''), '0')::bigint;
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT base + row_number() OVER (), change.type, clock_timestamp(), r.id, r.request_id,
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
    GET DIAGNOSTICS n = ROW_COUNT;
    ignored := set_config('holdfast.event_ordinal', ((base & 1048575) + n)::text, true);
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION v_ax_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE base bigint; n bigint; ignored text;
BEGIN
    base := (pg_current_xact_id()::text::bigint << 20)
          | coalesce(nullif(current_setting('holdfast.event_ordinal', true), ''), '0')::bigint;
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT base + row_number() OVER (), 'RESERVATION_' || r.state, clock_timestamp(), r.id,
           r.request_id, r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at,
           r.expires_at, r.extensions_used, r.labels, r.rejection_participant,
           r.rejection_resource, r.rejection_reason, r.late_payment_honored, r.version,
           r.payment_participant, r.payment_ref, r.payment_amount_minor, r.payment_currency,
           r.refund_id, r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM recorded r;
    GET DIAGNOSTICS n = ROW_COUNT;
    ignored := set_config('holdfast.event_ordinal', ((base & 1048575) + n)::text, true);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION v_ap_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT holdfast_next_event_sequence(), c.type, clock_timestamp(), c.id, c.request_id,
           c.holder, c.owner, c.state, c.release_outcome, c.ttl_ms, c.created_at, c.expires_at,
           c.extensions_used, c.labels, c.rejection_participant, c.rejection_resource,
           c.rejection_reason, c.late_payment_honored, c.version, c.payment_participant,
           c.payment_ref, c.payment_amount_minor, c.payment_currency, c.refund_id,
           c.refund_state, c.refund_reason, c.refund_failure, c.generation
    FROM (SELECT r.*, unnest(CASE
            WHEN r.state IS DISTINCT FROM was.state AND NOT (r.payment_ref IS NOT NULL AND was.payment_ref IS NULL)
                 AND r.extensions_used <= was.extensions_used AND r.refund_state IS NOT DISTINCT FROM was.refund_state
            THEN ARRAY['RESERVATION_' || r.state]
            ELSE array_remove(ARRAY[
              CASE WHEN r.payment_ref IS NOT NULL AND was.payment_ref IS NULL THEN 'PAYMENT_RECORDED' END,
              CASE WHEN r.state IS DISTINCT FROM was.state THEN 'RESERVATION_' || r.state END,
              CASE WHEN r.extensions_used > was.extensions_used THEN 'RESERVATION_EXTENDED' END,
              CASE WHEN r.refund_state IS DISTINCT FROM was.refund_state AND r.refund_state IS NOT NULL THEN 'REFUND_' || r.refund_state END], NULL) END) AS type
          FROM changed r JOIN was ON was.id = r.id) c;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION v_aj_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (sequence, type, occurred_at, reservation_id, request_id, holder, owner,
                        state, release_outcome, ttl_ms, created_at, expires_at, extensions_used,
                        labels, rejection_participant, rejection_resource, rejection_reason,
                        late_payment_honored, version, payment_participant, payment_ref,
                        payment_amount_minor, payment_currency, refund_id, refund_state,
                        refund_reason, refund_failure, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_' || r.state, clock_timestamp(), r.id, r.request_id,
           r.holder, r.owner, r.state, r.release_outcome, r.ttl_ms, r.created_at, r.expires_at,
           r.extensions_used, r.labels, r.rejection_participant, r.rejection_resource,
           r.rejection_reason, r.late_payment_honored, r.version, r.payment_participant,
           r.payment_ref, r.payment_amount_minor, r.payment_currency, r.refund_id,
           r.refund_state, r.refund_reason, r.refund_failure, r.generation
    FROM changed r JOIN was ON was.id = r.id WHERE r.state IS DISTINCT FROM was.state;
    RETURN NULL;
END $$;


DROP TABLE IF EXISTS events_np; CREATE TABLE events_np (LIKE events INCLUDING DEFAULTS);
DROP TABLE IF EXISTS events_nr; CREATE TABLE events_nr (sequence bigint PRIMARY KEY, event_id uuid NOT NULL DEFAULT gen_random_uuid(),
  type text NOT NULL, occurred_at timestamptz NOT NULL, from_queue boolean NOT NULL DEFAULT false, reservation_id uuid NOT NULL,
  state text NOT NULL, version bigint NOT NULL, expires_at timestamptz NOT NULL, extensions_used integer NOT NULL,
  payment_ref text, refund_state text, generation integer NOT NULL);
DO $$
DECLARE src text;
BEGIN
  src := pg_get_functiondef('holdfast_reservations_changed_events'::regproc);
  EXECUTE replace(replace(src, 'holdfast_reservations_changed_events', 'v_np_changed'), 'INSERT INTO events ', 'INSERT INTO events_np ');
  src := pg_get_functiondef('holdfast_reservations_recorded_events'::regproc);
  EXECUTE replace(replace(src, 'holdfast_reservations_recorded_events', 'v_np_recorded'), 'INSERT INTO events ', 'INSERT INTO events_np ');
END $$;
CREATE OR REPLACE FUNCTION v_nr_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events_nr (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, payment_ref, refund_state, generation)
    SELECT holdfast_next_event_sequence(), change.type, clock_timestamp(), r.id, r.state, r.version, r.expires_at, r.extensions_used, r.payment_ref, r.refund_state, r.generation
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
END $$;
CREATE OR REPLACE FUNCTION v_nr_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events_nr (sequence, type, occurred_at, reservation_id, state, version, expires_at, extensions_used, payment_ref, refund_state, generation)
    SELECT holdfast_next_event_sequence(), 'RESERVATION_' || r.state, clock_timestamp(), r.id, r.state, r.version, r.expires_at, r.extensions_used, r.payment_ref, r.refund_state, r.generation
    FROM recorded r;
    RETURN NULL;
END $$;
CREATE OR REPLACE PROCEDURE use_log(v text) LANGUAGE plpgsql AS $$
DECLARE ins text; upd text;
BEGIN
  DROP TRIGGER IF EXISTS reservations_recorded_events ON reservations;
  DROP TRIGGER IF EXISTS reservations_changed_events ON reservations;
  IF v IN ('A0', 'A1') THEN RETURN; END IF;
  ins := CASE v WHEN 'AX' THEN 'v_ax_recorded' WHEN 'ANP' THEN 'v_np_recorded' WHEN 'ANR' THEN 'v_nr_recorded' ELSE 'holdfast_reservations_recorded_events' END;
  upd := CASE v WHEN 'AX' THEN 'v_ax_changed' WHEN 'ANP' THEN 'v_np_changed' WHEN 'ANR' THEN 'v_nr_changed' WHEN 'AN' THEN 'v_an_changed' WHEN 'AO' THEN 'v_an_changed' WHEN 'AJ' THEN 'v_aj_changed' WHEN 'AP' THEN 'v_ap_changed' ELSE 'holdfast_reservations_changed_events' END;
  EXECUTE format('CREATE TRIGGER reservations_recorded_events AFTER INSERT ON reservations REFERENCING NEW TABLE AS recorded FOR EACH STATEMENT EXECUTE FUNCTION %I()', ins);
  IF v = 'AN' THEN
    EXECUTE format('CREATE TRIGGER reservations_changed_events AFTER UPDATE ON reservations REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION %I()', upd);
  ELSE
    EXECUTE format('CREATE TRIGGER reservations_changed_events AFTER UPDATE ON reservations REFERENCING OLD TABLE AS was NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION %I()', upd);
  END IF;
END $$;
