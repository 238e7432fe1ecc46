-- Waitlists (SPEC 11): a Reserve with `queue` that is refused for capacity is recorded QUEUED
-- and waits in the queue of each resource that refused it; an offer places the whole
-- reservation again as a new generation of branches (store/waitlist.rs).

ALTER TABLE reservations
    DROP CONSTRAINT reservations_state_check,
    ADD CONSTRAINT reservations_state_check CHECK (state IN ('TRYING', 'HELD', 'CONFIRMING',
        'CONFIRMED', 'CANCELLING', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED', 'QUEUED')) NOT VALID,
    -- A failed offer (or the first refusal of a reservation some of whose holds were placed)
    -- releases what it placed, then the reservation is QUEUED again.
    DROP CONSTRAINT reservations_release_outcome_check,
    ADD CONSTRAINT reservations_release_outcome_check CHECK (release_outcome IN ('CANCELLED',
        'EXPIRED', 'REJECTED', 'FAILED', 'QUEUED')) NOT VALID,
    -- When it first joined a queue (database clock); set once, never cleared: a HELD reached
    -- with it set came from a waitlist offer.
    ADD COLUMN queued_at timestamptz,
    -- When its wait ends: queued_at + wait_up_to. A QUEUED reservation past it is REJECTED
    -- with QUEUE_WAIT_ENDED.
    ADD COLUMN queue_until timestamptz;
ALTER TABLE reservations VALIDATE CONSTRAINT reservations_state_check;
ALTER TABLE reservations VALIDATE CONSTRAINT reservations_release_outcome_check;

-- Hold limits count queued reservations too (SPEC 11).
CREATE INDEX reservations_live_by_holder_v16 ON reservations (owner, holder)
    WHERE state IN ('TRYING', 'HELD', 'QUEUED');
DROP INDEX reservations_live_by_holder;
ALTER INDEX reservations_live_by_holder_v16 RENAME TO reservations_live_by_holder;

-- The waits that end: QUEUED reservations by queue_until.
CREATE INDEX reservations_queue_wait ON reservations (queue_until) WHERE state = 'QUEUED';

-- One row per (reservation, resource it waits for). Offer order is `seq` within a resource
-- (participant, resource, slot): first queued, first offered. Enqueues of one resource are
-- serialised (an advisory lock on the resource), so `seq` order is commit order per resource.
CREATE TABLE queue_entries (
    seq            bigserial   PRIMARY KEY,
    participant    text        NOT NULL,
    resource       text        NOT NULL,
    -- '' for a stock resource; the slot's start and end in microseconds since the epoch,
    -- "start/end", for a slot resource (during_start/during_end say the same, typed).
    slot           text        NOT NULL,
    during_start   timestamptz,
    during_end     timestamptz,
    reservation_id uuid        NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    -- What the reservation asks of this resource.
    quantity       bigint      NOT NULL CHECK (quantity >= 1),
    queued_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (reservation_id, participant, resource, slot)
);
CREATE INDEX queue_entries_in_order ON queue_entries (participant, resource, slot, seq);

-- Who offers a resource's released units: one replica at a time, by lease.
CREATE TABLE queue_offer_leases (
    participant text        NOT NULL,
    resource    text        NOT NULL,
    slot        text        NOT NULL,
    lease_owner uuid        NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (participant, resource, slot)
);

-- A reservation leaves every queue once it holds (an offer placed it) or ends; a failed
-- offer's return to QUEUED keeps its places.
CREATE FUNCTION holdfast_leave_queues() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_entries WHERE reservation_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER reservations_left_queues AFTER UPDATE OF state ON reservations
    FOR EACH ROW WHEN (NEW.queued_at IS NOT NULL AND NEW.state IN ('HELD', 'CONFIRMING',
        'CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED'))
    EXECUTE FUNCTION holdfast_leave_queues();
