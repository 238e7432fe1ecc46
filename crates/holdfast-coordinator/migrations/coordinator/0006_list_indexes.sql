-- An index for every shape of ListReservations (#15 item 13), each in the listing's order
-- (created_at DESC, id DESC) after its equality columns, so every shape's statement
-- (store/postgres/list.rs) walks exactly its page, generic plans included:
--   no filter             reservations_by_created            (0001)
--   holder                reservations_by_holder             (0001)
--   owner                 reservations_by_owner              (0003)
--   owner, holder         reservations_by_owner_holder       (0003)
--   state                 reservations_by_state
--   holder, state         reservations_by_holder_state
--   owner, state          reservations_by_owner_state
--   owner, holder, state  reservations_by_owner_holder_state
-- A state filter compares the stored state: HELD as read is stored HELD not past expires_at,
-- EXPIRED as read is stored EXPIRED plus lapsed HELD (two walks of the same index, merged).
--
-- On a large existing table, create these beforehand with CREATE INDEX CONCURRENTLY (same
-- names and columns): IF NOT EXISTS then leaves them be, and this migration takes no lock
-- worth mentioning.
CREATE INDEX IF NOT EXISTS reservations_by_state
    ON reservations (state, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS reservations_by_holder_state
    ON reservations (holder, state, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS reservations_by_owner_state
    ON reservations (owner, state, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS reservations_by_owner_holder_state
    ON reservations (owner, holder, state, created_at DESC, id DESC);

-- A cached (generic) plan knows a List's owner, holder and state only as parameters, and
-- estimates `col = $n` as 1/n_distinct of the table. A handful of principals and nine states
-- make that a third or a ninth: walking reservations_by_created and filtering then looks
-- cheaper than the index of the shape - and is ruinous for a small principal or a rare state
-- (FAILED), walking the whole table for a page. Declare these columns selective, as a filter
-- by them is; queries naming a value (the reaper's state = 'HELD', ...) still use the value's
-- own frequency from the statistics. ANALYZE applies it now (autovacuum's would later).
ALTER TABLE reservations ALTER COLUMN owner SET (n_distinct = 1000);
ALTER TABLE reservations ALTER COLUMN holder SET (n_distinct = 1000);
ALTER TABLE reservations ALTER COLUMN state SET (n_distinct = 1000);
ANALYZE reservations;
