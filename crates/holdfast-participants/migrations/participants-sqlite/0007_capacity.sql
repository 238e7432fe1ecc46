-- Capacity is its own fact (what PutResources set), not the sum of the counters: GetResource
-- reports it beside `available` (the counter Try takes from) and `held`/`confirmed` summed
-- from the hold rows, so a lost or duplicated unit shows as capacity != available + held +
-- confirmed (issue #21). Existing rows take their current sum.
ALTER TABLE stock_item ADD COLUMN capacity INTEGER NOT NULL DEFAULT 0 CHECK (capacity >= 0);
UPDATE stock_item SET capacity = available + held + confirmed;
CREATE INDEX stock_hold_resource_idx ON stock_hold (resource, state);

ALTER TABLE account ADD COLUMN capacity INTEGER NOT NULL DEFAULT 0 CHECK (capacity >= 0);
UPDATE account SET capacity = available + authorised + captured;
CREATE INDEX authorisation_resource_idx ON authorisation (resource, state);
CREATE INDEX payment_resource_idx ON payment (resource);
