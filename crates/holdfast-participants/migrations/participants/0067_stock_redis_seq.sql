-- stock-redis: the sequence of durable changes (#15 item 2). Redis counts every change it makes
-- durable (`P seq`, INCR by the Confirm and PutResources scripts) and the durable row keeps the
-- number it got. A Redis whose `P seq` is below the highest number here came back with older
-- data (a restart from a snapshot, a lost AOF tail, a failover to a lagging replica) and is
-- rebuilt before it serves.
ALTER TABLE stock_redis_confirmed ADD COLUMN seq bigint NOT NULL DEFAULT 0;
ALTER TABLE stock_redis_item ADD COLUMN seq bigint NOT NULL DEFAULT 0;
CREATE INDEX stock_redis_confirmed_seq ON stock_redis_confirmed (seq);
CREATE INDEX stock_redis_item_seq ON stock_redis_item (seq);
