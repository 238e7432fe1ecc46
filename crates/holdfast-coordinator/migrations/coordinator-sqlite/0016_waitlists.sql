-- Waitlists (SPEC 11): migrations/coordinator/0016 in SQLite's dialect.
--
-- SQLite cannot alter a CHECK constraint. Widening an IN-list changes nothing stored, so it
-- uses SQLite's own procedure for such changes (https://www.sqlite.org/lang_altertable.html,
-- "making other kinds of table schema changes": edit the table's text in sqlite_schema under
-- writable_schema) instead of rebuilding four tables, their indexes and triggers. RESET turns
-- writable_schema off and reloads this connection's schema; the CREATE statements below bump
-- the schema cookie, so every other open connection re-reads it. (Columns are added first:
-- ADD COLUMN edits the table's text at an offset taken from the loaded schema.)

-- When it first joined a queue; when its wait ends (microseconds, database clock).
ALTER TABLE reservations ADD COLUMN queued_at INTEGER;
ALTER TABLE reservations ADD COLUMN queue_until INTEGER;

PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(replace(sql,
    '''EXPIRED'', ''REJECTED'', ''FAILED'')),',
    '''EXPIRED'', ''REJECTED'', ''FAILED'', ''QUEUED'')),'),
    'CHECK (release_outcome IN (''CANCELLED'', ''EXPIRED'', ''REJECTED'', ''FAILED''))',
    'CHECK (release_outcome IN (''CANCELLED'', ''EXPIRED'', ''REJECTED'', ''FAILED'', ''QUEUED''))')
WHERE type = 'table' AND name = 'reservations';
PRAGMA writable_schema = RESET;

DROP INDEX reservations_live_by_holder;
CREATE INDEX reservations_live_by_holder ON reservations (owner, holder)
    WHERE state IN ('TRYING', 'HELD', 'QUEUED');
CREATE INDEX reservations_queue_wait ON reservations (queue_until) WHERE state = 'QUEUED';

CREATE TABLE queue_entries (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    participant    TEXT    NOT NULL,
    resource       TEXT    NOT NULL,
    slot           TEXT    NOT NULL,
    during_start   INTEGER,
    during_end     INTEGER,
    reservation_id BLOB    NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    quantity       INTEGER NOT NULL CHECK (quantity >= 1),
    queued_at      INTEGER NOT NULL,
    UNIQUE (reservation_id, participant, resource, slot)
) STRICT;
CREATE INDEX queue_entries_in_order ON queue_entries (participant, resource, slot, seq);

CREATE TABLE queue_offer_leases (
    participant TEXT    NOT NULL,
    resource    TEXT    NOT NULL,
    slot        TEXT    NOT NULL,
    lease_owner BLOB    NOT NULL,
    lease_until INTEGER NOT NULL,
    PRIMARY KEY (participant, resource, slot)
) STRICT;

CREATE TRIGGER reservations_left_queues AFTER UPDATE OF state ON reservations
WHEN NEW.queued_at IS NOT NULL AND NEW.state IN ('HELD', 'CONFIRMING', 'CONFIRMED', 'CANCELLED',
                                                 'EXPIRED', 'REJECTED', 'FAILED')
BEGIN
    DELETE FROM queue_entries WHERE reservation_id = NEW.id;
END;
