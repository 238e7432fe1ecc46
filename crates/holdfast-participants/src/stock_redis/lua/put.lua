-- Creates or resizes items, all or nothing. KEYS[1] = ready marker, KEYS[2] = the data set's
-- sequence of durable changes. ARGV[1] = key prefix, ARGV[2] = n, then resource, capacity per
-- item, then the lowest sequence the data set may have (else it is behind: the marker goes).
-- Returns {'ok', seq} (the change's sequence number), {'rebuilding'} or
-- {'refused', resource, held, confirmed} when a capacity is below what is held and confirmed.
local n = tonumber(ARGV[2])
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[3 + 2 * n]) then
  redis.call('DEL', KEYS[1])
  return {'rebuilding'}
end
if not redis.call('GET', KEYS[1]) then return {'rebuilding'} end
local cur = {}
for i = 1, n do
  local res = ARGV[1 + 2 * i]
  local h = tonumber(redis.call('GET', ARGV[1] .. 'h:' .. res) or '0')
  local c = tonumber(redis.call('GET', ARGV[1] .. 'c:' .. res) or '0')
  if h + c > tonumber(ARGV[2 + 2 * i]) then return {'refused', res, tostring(h), tostring(c)} end
  cur[i] = {h, c}
end
for i = 1, n do
  local res = ARGV[1 + 2 * i]
  local cap = tonumber(ARGV[2 + 2 * i])
  redis.call('SET', ARGV[1] .. 'cap:' .. res, cap)
  redis.call('SET', ARGV[1] .. 'h:' .. res, cur[i][1])
  redis.call('SET', ARGV[1] .. 'c:' .. res, cur[i][2])
  redis.call('SET', ARGV[1] .. 'a:' .. res, cap - cur[i][1] - cur[i][2])
end
return {'ok', tostring(redis.call('INCR', KEYS[2]))}
