-- Confirm. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index.
-- ARGV[1] = key prefix (item counters are `<prefix>h:<res>`, `<prefix>c:<res>`), ARGV[2] =
-- retention (ms), ARGV[3] = a tombstone's time to live (ms).
-- Returns {outcome, epoch, res1, q1, ...}; outcome `confirmed` (with the items to make
-- durable and the epoch of the confirm), `cancelled`, `hold_lost`, `missing` (no record: a
-- `hold_lost` tombstone was written) or `rebuilding`.
local epoch = redis.call('GET', KEYS[2])
if not epoch then return {'rebuilding', ''} end
local rec = KEYS[1]
local s = redis.call('HGET', rec, 's')
if not s then
  redis.call('HSET', rec, 's', 'hold_lost')
  redis.call('PEXPIRE', rec, ARGV[3])
  return {'missing', epoch}
end
local n = tonumber(redis.call('HGET', rec, 'n') or '0')
if s == 'held' then
  for i = 1, n do
    local res = redis.call('HGET', rec, 'i' .. i)
    local q = redis.call('HGET', rec, 'q' .. i)
    redis.call('DECRBY', ARGV[1] .. 'h:' .. res, q)
    redis.call('INCRBY', ARGV[1] .. 'c:' .. res, q)
  end
  redis.call('HSET', rec, 's', 'confirmed', 'e', epoch)
  redis.call('ZREM', KEYS[3], rec)
  local u = tonumber(redis.call('HGET', rec, 'u') or '0')
  redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[2])))
  s = 'confirmed'
end
if s == 'confirmed' then
  local out = {'confirmed', redis.call('HGET', rec, 'e') or epoch}
  for i = 1, n do
    out[#out + 1] = redis.call('HGET', rec, 'i' .. i)
    out[#out + 1] = redis.call('HGET', rec, 'q' .. i)
  end
  return out
end
if s == 'rejected' or s == 'hold_lost' then return {'hold_lost', epoch} end
return {'cancelled', epoch}
