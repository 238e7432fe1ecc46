-- The operator's control plane, as migrations/coordinator/0008 explains: every admin action,
-- recorded in the same transaction as the change it made; `at` in INTEGER microseconds of
-- the database clock.
CREATE TABLE admin_audit (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    reservation_id BLOB    REFERENCES reservations (id) ON DELETE CASCADE
                           CHECK (reservation_id IS NULL OR length(reservation_id) = 16),
    principal      TEXT    NOT NULL,
    at             INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000),
    action         TEXT    NOT NULL CHECK (action IN ('force_cancel', 'resolve_confirmed',
                                                      'resolve_cancelled', 'retry')),
    reason         TEXT    NOT NULL DEFAULT '',
    participant    TEXT
) STRICT;
CREATE INDEX admin_audit_by_reservation ON admin_audit (reservation_id, id);

CREATE INDEX IF NOT EXISTS branches_by_participant ON branches (participant, reservation_id);
