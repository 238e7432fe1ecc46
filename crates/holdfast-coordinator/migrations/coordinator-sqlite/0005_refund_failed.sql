-- Refunds a payment service refuses for good become FAILED (SPEC 8.1), with the reason
-- (migrations/coordinator/0005 in SQLite's dialect).
--
-- SQLite cannot alter a CHECK constraint, so the three tables are rebuilt as 0003 rebuilt two,
-- safe with foreign keys on: the new branches and extra_payments tables reference the new
-- reservations table before the old tables are dropped (children first), so the ON DELETE
-- CASCADE of the old tables deletes nothing that is kept; the renames then carry the
-- references over to the final names.

CREATE TABLE reservations_v5 (
    id                    BLOB    PRIMARY KEY CHECK (length(id) = 16),
    request_id            TEXT    NOT NULL,
    holder                TEXT    NOT NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('TRYING', 'HELD', 'CONFIRMING', 'CONFIRMED',
                                                 'CANCELLING', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')),
    -- The terminal state a CANCELLING reservation ends in; fixed when the release is decided.
    release_outcome       TEXT    CHECK (release_outcome IN ('CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')),
    -- The principal that created it ('' when authentication was off).
    owner                 TEXT    NOT NULL DEFAULT '',
    -- What verifies the hold token: SHA-256 of the token, and the id of the key it was derived
    -- with (NULL: issued before derivation; a repeat Reserve cannot answer it again). The token
    -- itself is never stored.
    token_digest          BLOB    CHECK (token_digest IS NULL OR length(token_digest) = 32),
    token_key_id          TEXT,
    -- A token stored in plaintext by an earlier version, until SqliteStore::migrate replaces it
    -- by its digest (SQLite has no SHA-256 of its own). NULL for every newer row.
    legacy_hold_token     TEXT,
    ttl_ms                INTEGER NOT NULL CHECK (ttl_ms > 0),
    created_at            INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    updated_at            INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    expires_at            INTEGER NOT NULL,
    extensions_used       INTEGER NOT NULL DEFAULT 0,
    labels                TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    cancel_reason         TEXT,
    rejection_participant TEXT,
    rejection_resource    TEXT,
    rejection_reason      TEXT,
    late_payment_honored  INTEGER NOT NULL DEFAULT 0 CHECK (late_payment_honored IN (0, 1)),
    -- Bumped on every state change; watchers compare it.
    version               INTEGER NOT NULL DEFAULT 1,
    -- Work lease: the coordinator instance driving this reservation, and until when. Another
    -- instance takes the work over only after lease_until (claimed under BEGIN IMMEDIATE).
    lease_owner           BLOB,
    lease_until           INTEGER,
    -- When recovery should next drive a CONFIRMING/CANCELLING reservation (backoff), and how
    -- many times it has tried.
    next_attempt_at       INTEGER,
    recovery_attempts     INTEGER NOT NULL DEFAULT 0,
    -- The payment given to Confirm, if any.
    payment_participant   TEXT,
    payment_ref           TEXT,
    payment_amount_minor  INTEGER,
    payment_currency      TEXT,
    -- The one refund of that payment, when it could not be honoured. Sent to the payment
    -- participant until acknowledged; refund_id is its idempotency key.
    refund_id             BLOB    UNIQUE,
    refund_state          TEXT    CHECK (refund_state IN ('PENDING', 'REFUNDED', 'FAILED')),
    refund_reason         TEXT,
    -- Why the payment participant refused the refund for good (refund_state FAILED).
    refund_failure        TEXT,
    -- Which placement of the holds is current: a late payment re-places released holds as a
    -- new generation of branches.
    generation            INTEGER NOT NULL DEFAULT 0,
    last_extend_request_id TEXT,
    UNIQUE (owner, holder, request_id)
) STRICT;

INSERT INTO reservations_v5 (id, request_id, holder, state, release_outcome, owner, token_digest, token_key_id,
    legacy_hold_token, ttl_ms, created_at, updated_at, expires_at, extensions_used, labels,
    cancel_reason, rejection_participant, rejection_resource, rejection_reason,
    late_payment_honored, version, lease_owner, lease_until, next_attempt_at, recovery_attempts,
    payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id,
    refund_state, refund_reason, generation, last_extend_request_id)
SELECT id, request_id, holder, state, release_outcome, owner, token_digest, token_key_id,
    legacy_hold_token, ttl_ms, created_at, updated_at, expires_at, extensions_used, labels,
    cancel_reason, rejection_participant, rejection_resource, rejection_reason,
    late_payment_honored, version, lease_owner, lease_until, next_attempt_at, recovery_attempts,
    payment_participant, payment_ref, payment_amount_minor, payment_currency, refund_id,
    refund_state, refund_reason, generation, last_extend_request_id
FROM reservations;

CREATE TABLE branches_v5 (
    reservation_id BLOB    NOT NULL REFERENCES reservations_v5 (id) ON DELETE CASCADE,
    generation     INTEGER NOT NULL DEFAULT 0,
    -- Position in canonical (participant, resource) order.
    position       INTEGER NOT NULL,
    -- The participant-level TCC branch: shared by all holds of one participant in a reservation.
    branch_id      BLOB    NOT NULL,
    participant    TEXT    NOT NULL,
    resource       TEXT    NOT NULL,
    quantity       INTEGER NOT NULL CHECK (quantity >= 1),
    during_start   INTEGER,
    during_end     INTEGER,
    state          TEXT    NOT NULL CHECK (state IN ('PENDING', 'HELD', 'REJECTED', 'CONFIRMED',
                                                     'CANCELLED', 'HOLD_LOST')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT,
    PRIMARY KEY (reservation_id, generation, position),
    CHECK ((during_start IS NULL) = (during_end IS NULL) AND (during_start IS NULL OR during_start < during_end))
) STRICT;

INSERT INTO branches_v5 (reservation_id, generation, position, branch_id, participant, resource,
    quantity, during_start, during_end, state, attempts, last_error)
SELECT reservation_id, generation, position, branch_id, participant, resource,
    quantity, during_start, during_end, state, attempts, last_error
FROM branches;

CREATE TABLE extra_payments_v5 (
    payment_participant TEXT    NOT NULL,
    payment_ref         TEXT    NOT NULL,
    reservation_id      BLOB    NOT NULL REFERENCES reservations_v5 (id) ON DELETE CASCADE,
    amount_minor        INTEGER NOT NULL CHECK (amount_minor > 0),
    currency            TEXT    NOT NULL,
    refund_id           BLOB    NOT NULL UNIQUE CHECK (length(refund_id) = 16),
    refund_state        TEXT    NOT NULL CHECK (refund_state IN ('PENDING', 'REFUNDED', 'FAILED')),
    refund_reason       TEXT    NOT NULL,
    -- Why the payment participant refused the refund for good (refund_state FAILED).
    refund_failure      TEXT,
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     INTEGER,
    created_at          INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    PRIMARY KEY (payment_participant, payment_ref)
) STRICT;

INSERT INTO extra_payments_v5 (payment_participant, payment_ref, reservation_id, amount_minor,
    currency, refund_id, refund_state, refund_reason, attempts, next_attempt_at, created_at)
SELECT payment_participant, payment_ref, reservation_id, amount_minor,
    currency, refund_id, refund_state, refund_reason, attempts, next_attempt_at, created_at
FROM extra_payments;

DROP TABLE extra_payments;
DROP TABLE branches;
DROP TABLE reservations;
ALTER TABLE reservations_v5 RENAME TO reservations;
ALTER TABLE branches_v5 RENAME TO branches;
ALTER TABLE extra_payments_v5 RENAME TO extra_payments;

-- The indexes of 0003 and 0004, on the rebuilt tables.
CREATE INDEX reservations_by_created ON reservations (created_at DESC, id DESC);
CREATE INDEX reservations_by_holder ON reservations (holder, created_at DESC, id DESC);
CREATE INDEX reservations_by_owner ON reservations (owner, created_at DESC, id DESC);
CREATE INDEX reservations_by_owner_holder ON reservations (owner, holder, created_at DESC, id DESC);
CREATE INDEX reservations_live_by_holder ON reservations (owner, holder) WHERE state IN ('TRYING', 'HELD');
CREATE INDEX reservations_open ON reservations (state, expires_at)
    WHERE state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING');
CREATE INDEX reservations_payment_work ON reservations (next_attempt_at)
    WHERE refund_state = 'PENDING' OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL);
CREATE UNIQUE INDEX reservations_payment_binding
    ON reservations (payment_participant, payment_ref) WHERE payment_ref IS NOT NULL;
CREATE INDEX extra_payments_by_reservation ON extra_payments (reservation_id, created_at);
CREATE INDEX extra_payments_due ON extra_payments (next_attempt_at) WHERE refund_state = 'PENDING';
