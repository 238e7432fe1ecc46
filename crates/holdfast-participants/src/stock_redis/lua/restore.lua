-- Restores a durable confirmed branch. KEYS[1] = branch record, KEYS[2] = expiry index.
-- ARGV[1] = epoch, ARGV[2] = n, then resource, quantity per item, then the retention (ms)
-- from now. Returns 1 if written.
if redis.call('HGET', KEYS[1], 's') == 'confirmed' then return 0 end
redis.call('DEL', KEYS[1])
local n = tonumber(ARGV[2])
local fields = {'s', 'confirmed', 'a', 'held', 'r', '', 'e', ARGV[1], 'n', ARGV[2]}
for i = 1, n do
  fields[#fields + 1] = 'i' .. i
  fields[#fields + 1] = ARGV[1 + 2 * i]
  fields[#fields + 1] = 'q' .. i
  fields[#fields + 1] = ARGV[2 + 2 * i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIRE', KEYS[1], ARGV[#ARGV])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
