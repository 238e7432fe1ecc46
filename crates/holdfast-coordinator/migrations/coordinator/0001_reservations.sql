-- The coordinator's durable record: one row per reservation, one row per hold (branch).
-- Times come from the database clock (clock_timestamp()), never from application hosts.

CREATE TABLE reservations (
    id                    uuid        PRIMARY KEY,
    request_id            text        NOT NULL,
    holder                text        NOT NULL,
    state                 text        NOT NULL CHECK (state IN ('TRYING', 'HELD', 'CONFIRMING', 'CONFIRMED',
                                                     'CANCELLING', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')),
    -- The terminal state a CANCELLING reservation ends in; fixed when the release is decided.
    release_outcome       text        CHECK (release_outcome IN ('CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED')),
    -- Secret needed for Confirm/Cancel/Extend. Kept so an idempotent Reserve can answer it again;
    -- never returned by reads.
    hold_token            text        NOT NULL,
    ttl_ms                bigint      NOT NULL CHECK (ttl_ms > 0),
    created_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at            timestamptz NOT NULL,
    extensions_used       integer     NOT NULL DEFAULT 0,
    labels                jsonb       NOT NULL DEFAULT '{}'::jsonb,
    cancel_reason         text,
    rejection_participant text,
    rejection_resource    text,
    rejection_reason      text,
    late_payment_honored  boolean     NOT NULL DEFAULT false,
    -- Bumped on every state change; watchers compare it.
    version               bigint      NOT NULL DEFAULT 1,
    -- Work lease: the coordinator instance driving this reservation, and until when. Another
    -- instance takes the work over only after lease_until (claimed with FOR UPDATE SKIP LOCKED).
    lease_owner           uuid,
    lease_until           timestamptz,
    -- When recovery should next drive a CONFIRMING/CANCELLING reservation (backoff), and how
    -- many times it has tried.
    next_attempt_at       timestamptz,
    recovery_attempts     integer     NOT NULL DEFAULT 0,
    -- The payment given to Confirm, if any.
    payment_participant   text,
    payment_ref           text,
    payment_amount_minor  bigint,
    payment_currency      text,
    -- The one refund of that payment, when it could not be honoured. Sent to the payment
    -- participant until acknowledged; refund_id is its idempotency key.
    refund_id             uuid        UNIQUE,
    refund_state          text        CHECK (refund_state IN ('PENDING', 'REFUNDED')),
    refund_reason         text,
    -- Which placement of the holds is current: a late payment re-places released holds as a
    -- new generation of branches.
    generation            integer     NOT NULL DEFAULT 0,
    UNIQUE (holder, request_id)
);

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
    reservation_id uuid        NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    generation     integer     NOT NULL DEFAULT 0,
    -- Position in canonical (participant, resource) order.
    position       integer     NOT NULL,
    -- The participant-level TCC branch: shared by all holds of one participant in a reservation.
    branch_id      uuid        NOT NULL,
    participant    text        NOT NULL,
    resource       text        NOT NULL,
    quantity       bigint      NOT NULL CHECK (quantity >= 1),
    during_start   timestamptz,
    during_end     timestamptz,
    state          text        NOT NULL CHECK (state IN ('PENDING', 'HELD', 'REJECTED', 'CONFIRMED',
                                                         'CANCELLED', 'HOLD_LOST')),
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    PRIMARY KEY (reservation_id, generation, position),
    CHECK ((during_start IS NULL) = (during_end IS NULL) AND (during_start IS NULL OR during_start < during_end))
);
