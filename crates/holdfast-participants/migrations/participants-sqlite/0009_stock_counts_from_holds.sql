-- Reference participant `stock`: held and confirmed units are the hold rows' sums (GetResource
-- and resizing read them there); the item row keeps `available` and `capacity`, as on
-- PostgreSQL. Nothing to carry over: the sums are kept in the hold rows already.
ALTER TABLE stock_item DROP COLUMN held;
ALTER TABLE stock_item DROP COLUMN confirmed;
