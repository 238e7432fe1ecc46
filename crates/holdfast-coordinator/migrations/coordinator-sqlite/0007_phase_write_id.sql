-- The id of the last `record_phase` write applied to the reservation (PostgreSQL's group commit
-- reruns a batch whose commit acknowledgement was lost and skips writes found here). SQLite has
-- no group commit and does not write it; the column keeps both schemas alike.
ALTER TABLE reservations ADD COLUMN last_phase_write BLOB;
