-- Finishes a rebuild. KEYS[1] = ready marker, KEYS[2] = expiry index, KEYS[3] = the data set's
-- sequence of durable changes.
-- ARGV[1] = new epoch, ARGV[2] = key prefix, ARGV[3] = n, then per item resource, capacity,
-- durable confirmed units, then the durable record's highest sequence number. Sets every
-- item's counters from the durable record and the holds still visible, the sequence to at
-- least the durable one, then the marker. Returns -1 if the marker already existed, else n.
if redis.call('GET', KEYS[1]) then return -1 end
local held = {}
for _, rec in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if redis.call('HGET', rec, 's') == 'held' then
    local n = tonumber(redis.call('HGET', rec, 'n') or '0')
    for i = 1, n do
      local res = redis.call('HGET', rec, 'i' .. i)
      held[res] = (held[res] or 0) + tonumber(redis.call('HGET', rec, 'q' .. i))
    end
  else
    redis.call('ZREM', KEYS[2], rec)
  end
end
local n = tonumber(ARGV[3])
for i = 1, n do
  local res = ARGV[1 + 3 * i]
  local cap = tonumber(ARGV[2 + 3 * i])
  local conf = tonumber(ARGV[3 + 3 * i])
  local h = held[res] or 0
  redis.call('SET', ARGV[2] .. 'cap:' .. res, cap)
  redis.call('SET', ARGV[2] .. 'c:' .. res, conf)
  redis.call('SET', ARGV[2] .. 'h:' .. res, h)
  redis.call('SET', ARGV[2] .. 'a:' .. res, cap - conf - h)
end
local durable = tonumber(ARGV[4 + 3 * n])
if tonumber(redis.call('GET', KEYS[3]) or '0') < durable then
  redis.call('SET', KEYS[3], string.format('%d', durable))
end
redis.call('SET', KEYS[1], ARGV[1])
return n
