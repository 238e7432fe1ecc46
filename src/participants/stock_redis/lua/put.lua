-- Creates or resizes items, all or nothing. KEYS[1] = ready marker. ARGV[1] = key prefix,
-- ARGV[2] = n, then resource, capacity per item. Returns {'ok'}, {'rebuilding'} or
-- {'refused', resource, held, confirmed} when a capacity is below what is held and confirmed.
if not redis.call('GET', KEYS[1]) then return {'rebuilding'} end
local n = tonumber(ARGV[2])
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
return {'ok'}
