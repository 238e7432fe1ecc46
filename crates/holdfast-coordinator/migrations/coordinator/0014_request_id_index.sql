-- The console's search and ListReservations' `request_id` lookup: the reservations made with a
-- Reserve request id, whatever their holder, newest first (store/postgres/find.rs). An id prefix
-- needs no index of its own: it is a range of the primary key.
--
-- On a large existing table, create it beforehand with CREATE INDEX CONCURRENTLY (same name and
-- columns): IF NOT EXISTS then leaves it be.
CREATE INDEX IF NOT EXISTS reservations_by_request_id
    ON reservations (request_id, created_at DESC, id DESC);
