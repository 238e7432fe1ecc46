-- Try. KEYS[1] = branch record, KEYS[2] = ready marker, KEYS[3] = expiry index,
-- KEYS[4..3+n] = available counters, KEYS[4+n..3+2n] = held counters (items sorted),
-- KEYS[4+2n] = the data set's sequence of durable changes.
-- ARGV[1] = hold_until (ms), ARGV[2] = n, ARGV[3..2+n] = resources, ARGV[3+n..2+2n] = quantities,
-- ARGV[3+2n] = retention (ms): a refused Try's record expires at hold_until + retention,
-- ARGV[4+2n] = the lowest sequence the data set may have (else it is behind: the marker goes).
-- Returns {answer, reason}, answer `held`, `rejected` or `rebuilding` (nothing written).
local rec = KEYS[1]
local n = tonumber(ARGV[2])
if tonumber(redis.call('GET', KEYS[4 + 2 * n]) or '0') < tonumber(ARGV[4 + 2 * n]) then
  redis.call('DEL', KEYS[2])
  return {'rebuilding', ''}
end
local function refuse(reason)
  redis.call('HSET', rec, 's', 'rejected', 'a', 'rejected', 'r', reason)
  redis.call('PEXPIREAT', rec, string.format('%d', tonumber(ARGV[1]) + tonumber(ARGV[3 + 2 * n])))
  return {'rejected', reason}
end
local s = redis.call('HGET', rec, 's')
if s then
  local a = redis.call('HGET', rec, 'a')
  if a then return {a, redis.call('HGET', rec, 'r') or ''} end
  local reason = 'branch was cancelled before its Try'
  if s == 'hold_lost' then reason = 'branch was confirmed before its Try; nothing is held' end
  redis.call('HSET', rec, 'a', 'rejected', 'r', reason)
  return {'rejected', reason}
end
if not redis.call('GET', KEYS[2]) then return {'rebuilding', ''} end
for i = 1, n do
  local avail = redis.call('GET', KEYS[3 + i])
  local want = tonumber(ARGV[2 + n + i])
  local reason = nil
  if not avail then
    reason = 'item ' .. ARGV[2 + i] .. ' does not exist'
  elseif tonumber(avail) < want then
    reason = 'insufficient stock of ' .. ARGV[2 + i] .. ': ' .. ARGV[2 + n + i] .. ' requested, ' .. avail .. ' available'
  end
  if reason then return refuse(reason) end
end
local fields = {'s', 'held', 'a', 'held', 'r', '', 'u', ARGV[1], 'n', ARGV[2]}
for i = 1, n do
  local q = ARGV[2 + n + i]
  redis.call('DECRBY', KEYS[3 + i], q)
  redis.call('INCRBY', KEYS[3 + n + i], q)
  fields[#fields + 1] = 'i' .. i
  fields[#fields + 1] = ARGV[2 + i]
  fields[#fields + 1] = 'q' .. i
  fields[#fields + 1] = q
end
redis.call('HSET', rec, unpack(fields))
redis.call('ZADD', KEYS[3], ARGV[1], rec)
return {'held', ''}
