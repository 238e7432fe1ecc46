-- Cancel. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index,
-- KEYS[4] = the data set's sequence of durable changes.
-- ARGV[1] = key prefix, ARGV[2] = retention (ms), ARGV[3] = a tombstone's time to live (ms),
-- ARGV[4] = the lowest sequence the data set may have (else it is behind: the marker goes).
-- Returns {outcome, epoch}: `cancelled`, `confirmed` (refused), `tombstone` (no record: a
-- `cancelled` tombstone was written) or `rebuilding`.
if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[2])
  return {'rebuilding', ''}
end
local epoch = redis.call('GET', KEYS[2])
if not epoch then return {'rebuilding', ''} end
local rec = KEYS[1]
local s = redis.call('HGET', rec, 's')
if not s then
  redis.call('HSET', rec, 's', 'cancelled')
  redis.call('PEXPIRE', rec, ARGV[3])
  return {'tombstone', epoch}
end
if s == 'rejected' then
  redis.call('HSET', rec, 's', 'cancelled')
  return {'cancelled', epoch}
end
if s == 'held' then
  local n = tonumber(redis.call('HGET', rec, 'n') or '0')
  for i = 1, n do
    local res = redis.call('HGET', rec, 'i' .. i)
    local q = redis.call('HGET', rec, 'q' .. i)
    redis.call('INCRBY', ARGV[1] .. 'a:' .. res, q)
    redis.call('DECRBY', ARGV[1] .. 'h:' .. res, q)
  end
  redis.call('HSET', rec, 's', 'cancelled')
  redis.call('ZREM', KEYS[3], rec)
  local u = tonumber(redis.call('HGET', rec, 'u') or '0')
  redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[2])))
  return {'cancelled', epoch}
end
if s == 'confirmed' then return {'confirmed', epoch} end
return {'cancelled', epoch}
