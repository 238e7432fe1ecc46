-- The console's search and ListReservations' `request_id` lookup: the reservations made with a
-- Reserve request id, whatever their holder, newest first (store/sqlite/find.rs). An id prefix
-- needs no index of its own: it is a range of the primary key.
CREATE INDEX IF NOT EXISTS reservations_by_request_id
    ON reservations (request_id, created_at DESC, id DESC);
