-- An index for every shape of ListReservations, as migrations/coordinator/0006 explains: each
-- in the listing's order (created_at DESC, id DESC) after its equality columns
-- (store/sqlite/rows.rs, list_statement).
CREATE INDEX IF NOT EXISTS reservations_by_state
    ON reservations (state, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS reservations_by_holder_state
    ON reservations (holder, state, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS reservations_by_owner_state
    ON reservations (owner, state, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS reservations_by_owner_holder_state
    ON reservations (owner, holder, state, created_at DESC, id DESC);
