-- Confirm. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index,
-- KEYS[4] = the data set's sequence of durable changes.
-- ARGV[1] = key prefix (item counters are `<prefix>h:<res>`, `<prefix>c:<res>`), ARGV[2] =
-- retention (ms), ARGV[3] = a tombstone's time to live (ms), ARGV[4] = the lowest sequence the
-- data set may have (else it is behind: the marker goes).
-- Returns {outcome, epoch, ...}; outcome `confirmed` (then the sequence number of the confirm
-- and the items to make durable: {'confirmed', epoch, seq, res1, q1, ...}), `cancelled`,
-- `hold_lost`, `missing` (no record: a `hold_lost` tombstone was written) or `rebuilding`.
if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[2])
  return {'rebuilding', ''}
end
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
  local seq = redis.call('INCR', KEYS[4])
  redis.call('HSET', rec, 's', 'confirmed', 'e', epoch, 'sq', seq)
  redis.call('ZREM', KEYS[3], rec)
  local u = tonumber(redis.call('HGET', rec, 'u') or '0')
  redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[2])))
  s = 'confirmed'
end
if s == 'confirmed' then
  local out = {'confirmed', redis.call('HGET', rec, 'e') or epoch, redis.call('HGET', rec, 'sq') or '0'}
  for i = 1, n do
    out[#out + 1] = redis.call('HGET', rec, 'i' .. i)
    out[#out + 1] = redis.call('HGET', rec, 'q' .. i)
  end
  return out
end
if s == 'rejected' or s == 'hold_lost' then return {'hold_lost', epoch} end
return {'cancelled', epoch}
