-- Extend. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index,
-- KEYS[4] = the data set's sequence of durable changes.
-- ARGV[1] = the new hold_until (ms), ARGV[2] = the lowest sequence the data set may have
-- (else it is behind: the marker goes).
-- A held record's hold_until (`u`) and its expiry entry move to ARGV[1] unless later already
-- (never earlier). Returns {outcome, epoch}: `held`, `confirmed`, `cancelled`, `hold_lost`
-- (refused or lost), `missing` (no record; nothing written) or `rebuilding`.
if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[2])
  return {'rebuilding', ''}
end
local epoch = redis.call('GET', KEYS[2])
if not epoch then return {'rebuilding', ''} end
local rec = KEYS[1]
local s = redis.call('HGET', rec, 's')
if not s then return {'missing', epoch} end
if s == 'held' then
  local u = tonumber(redis.call('HGET', rec, 'u') or '0')
  if tonumber(ARGV[1]) > u then
    redis.call('HSET', rec, 'u', ARGV[1])
    redis.call('ZADD', KEYS[3], ARGV[1], rec)
  end
  return {'held', epoch}
end
if s == 'confirmed' or s == 'cancelled' then return {s, epoch} end
return {'hold_lost', epoch}
