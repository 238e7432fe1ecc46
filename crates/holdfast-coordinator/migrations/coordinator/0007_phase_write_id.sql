-- The id of the last `record_phase` write applied to the reservation, written in the same
-- statement: a group-committed batch whose commit acknowledgement was lost is run again call by
-- call, and a call whose write id is already here was applied by the batch (its branch reports
-- are not counted twice).
ALTER TABLE reservations ADD COLUMN last_phase_write uuid;
