-- Capacity is its own fact (what PutResources set), not the sum of the counters: GetResource
-- reports it beside `available` (the counter Try takes from) and `held`/`confirmed` summed
-- from the hold rows, so a lost or duplicated unit shows as capacity != available + held +
-- confirmed (issue #21). Existing rows take their current sum.
ALTER TABLE stock_item ADD COLUMN capacity bigint;
UPDATE stock_item SET capacity = available + held + confirmed;
ALTER TABLE stock_item ALTER COLUMN capacity SET NOT NULL;
ALTER TABLE stock_item ADD CONSTRAINT stock_item_capacity CHECK (capacity >= 0);
CREATE INDEX stock_hold_resource_idx ON stock_hold (resource, state);

ALTER TABLE account ADD COLUMN capacity bigint;
UPDATE account SET capacity = available + authorised + captured;
ALTER TABLE account ALTER COLUMN capacity SET NOT NULL;
ALTER TABLE account ADD CONSTRAINT account_capacity CHECK (capacity >= 0);
CREATE INDEX authorisation_resource_idx ON authorisation (resource, state);
CREATE INDEX payment_resource_idx ON payment (resource);
