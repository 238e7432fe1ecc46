-- The coordinator's durable record on SQLite: the schema of migrations/coordinator/ in SQLite's
-- dialect. Same tables, columns, constraints and indexes; only the representations differ:
--   * times are INTEGER microseconds since the Unix epoch (UTC), always computed from the
--     database clock (unixepoch('subsec'), millisecond resolution) by the statements in
--     src/store/sqlite.rs, never from an application host;
--   * UUIDs are 16-byte BLOBs (sqlx's SQLite encoding), so they sort as in PostgreSQL;
--   * labels are JSON text; booleans are 0/1.
-- STRICT tables make SQLite enforce the declared types. ON DELETE CASCADE needs
-- PRAGMA foreign_keys = ON, which every connection sets.

CREATE TABLE reservations (
    id                    BLOB    PRIMARY KEY CHECK (length(id) = 16),
    request_id            TEXT    NOT NULL,
    holder                TEXT    NOT NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('TRYING', 'HELD', 'CONFIRMING', 'CONFIRMED',
                                                 'CANCELLING', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')),
    -- The terminal state a CANCELLING reservation ends in; fixed when the release is decided.
    release_outcome       TEXT    CHECK (release_outcome IN ('CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')),
    -- Secret needed for Confirm/Cancel/Extend. Kept so an idempotent Reserve can answer it again;
    -- never returned by reads.
    hold_token            TEXT    NOT NULL,
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
    refund_state          TEXT    CHECK (refund_state IN ('PENDING', 'REFUNDED')),
    refund_reason         TEXT,
    -- Which placement of the holds is current: a late payment re-places released holds as a
    -- new generation of branches.
    generation            INTEGER NOT NULL DEFAULT 0,
    UNIQUE (holder, request_id)
) STRICT;

-- Paging newest first, overall and per holder.
CREATE INDEX reservations_by_created ON reservations (created_at DESC, id DESC);
CREATE INDEX reservations_by_holder ON reservations (holder, created_at DESC, id DESC);
-- Hold limits count a holder's live reservations.
CREATE INDEX reservations_live_by_holder ON reservations (holder) WHERE state IN ('TRYING', 'HELD');
-- Work that still needs driving (reaper, recovery): small, because most rows are terminal.
CREATE INDEX reservations_open ON reservations (state, expires_at)
    WHERE state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING');
-- Refunds still owed, and late payments being honoured.
CREATE INDEX reservations_payment_work ON reservations (next_attempt_at)
    WHERE refund_state = 'PENDING' OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL);

CREATE TABLE branches (
    reservation_id BLOB    NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
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
