-- Reference participant `stock`: held and confirmed units are the hold rows' sums (GetResource
-- and resizing read them there), so the item row keeps only `available` (the counter Try takes
-- from) and `capacity`. A Confirm then moves only its hold row and never waits for the item's
-- row lock, which every Try of the item takes (#20). Nothing to carry over: the sums are kept
-- in the hold rows already.
ALTER TABLE stock_item DROP COLUMN held, DROP COLUMN confirmed;
