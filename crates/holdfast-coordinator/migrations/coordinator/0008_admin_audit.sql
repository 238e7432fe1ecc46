-- The operator's control plane (tcc.v1.Admin, SPEC 8.1): every admin action, recorded in the
-- same transaction as the change it made (store/admin.rs). `at` is the database clock.
-- A reservation's entries go with it (retention deletes finished reservations); a Retry of
-- every reservation at a participant has no reservation_id and names the participant.
CREATE TABLE admin_audit (
    id             bigserial   PRIMARY KEY,
    reservation_id uuid        REFERENCES reservations (id) ON DELETE CASCADE,
    principal      text        NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    action         text        NOT NULL CHECK (action IN ('force_cancel', 'resolve_confirmed',
                                                          'resolve_cancelled', 'retry')),
    reason         text        NOT NULL DEFAULT '',
    participant    text
);
-- A reservation's entries (Reservation.audit, ListAudit by reservation, the cascade).
CREATE INDEX admin_audit_by_reservation ON admin_audit (reservation_id, id);

-- Reservations with a branch at a participant (ListReservations' and ListStuck's participant
-- filter, Retry by participant): the branch rows of that participant, then each reservation
-- by its primary key.
CREATE INDEX IF NOT EXISTS branches_by_participant ON branches (participant, reservation_id);
