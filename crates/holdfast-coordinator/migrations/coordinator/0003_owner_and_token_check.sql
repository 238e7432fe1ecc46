-- Identity (SPEC 7.2) and no plaintext hold token at rest (SPEC 7.3).
--
-- Each reservation records the principal that created it ('' when authentication was off); the
-- idempotency key of Reserve becomes (owner, holder, request_id), and hold limits count per
-- (owner, holder).
ALTER TABLE reservations ADD COLUMN owner text NOT NULL DEFAULT '';
ALTER TABLE reservations DROP CONSTRAINT reservations_holder_request_id_key;
ALTER TABLE reservations ADD CONSTRAINT reservations_owner_holder_request_id_key
    UNIQUE (owner, holder, request_id);
-- A principal's own reservations, newest first (List for a client).
CREATE INDEX reservations_by_owner ON reservations (owner, created_at DESC, id DESC);
CREATE INDEX reservations_by_owner_holder ON reservations (owner, holder, created_at DESC, id DESC);
DROP INDEX reservations_live_by_holder;
CREATE INDEX reservations_live_by_holder ON reservations (owner, holder) WHERE state IN ('TRYING', 'HELD');

-- What verifies a hold token: SHA-256 of the token, and the id of the key it was derived with
-- (NULL for tokens issued before derivation: they still verify, but a repeat Reserve cannot
-- answer them again). The plaintext column goes; existing tokens keep working through their
-- digest.
ALTER TABLE reservations ADD COLUMN token_digest bytea;
ALTER TABLE reservations ADD COLUMN token_key_id text;
ALTER TABLE reservations ALTER COLUMN hold_token DROP NOT NULL;
-- The new row versions carry no token; the old ones are dead tuples until (auto)vacuum
-- reclaims them: run VACUUM on `reservations` after the upgrade to purge them at once.
UPDATE reservations SET token_digest = sha256(convert_to(hold_token, 'UTF8')), hold_token = NULL;
ALTER TABLE reservations ALTER COLUMN token_digest SET NOT NULL;
ALTER TABLE reservations ADD CONSTRAINT reservations_token_digest_length CHECK (length(token_digest) = 32);
ALTER TABLE reservations DROP COLUMN hold_token;
