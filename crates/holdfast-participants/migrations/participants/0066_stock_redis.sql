-- Reference participant `stock-redis`: Redis is the fast gate, these tables are the durable
-- record of truth (see src/participants/stock_redis.rs). Redis keeps counters, holds and
-- barrier records; Postgres keeps capacity, every confirmed hold, and the Redis epoch.
CREATE TABLE stock_redis_item (
    resource text   PRIMARY KEY,
    capacity bigint NOT NULL CHECK (capacity >= 0)
);

-- One row per item of a confirmed branch, written before Confirm answers.
CREATE TABLE stock_redis_confirmed (
    reservation_id text        NOT NULL,
    branch_id      text        NOT NULL,
    resource       text        NOT NULL,
    quantity       bigint      NOT NULL CHECK (quantity > 0),
    confirmed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (reservation_id, branch_id, resource)
);
CREATE INDEX stock_redis_confirmed_resource ON stock_redis_confirmed (resource);

-- The generation of the Redis data set: bumped by every rebuild. A Confirm whose Redis script
-- ran under an older generation (its state may have been lost) is not made durable.
CREATE TABLE stock_redis_epoch (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    epoch bigint  NOT NULL
);
INSERT INTO stock_redis_epoch (id, epoch) VALUES (true, 0);
