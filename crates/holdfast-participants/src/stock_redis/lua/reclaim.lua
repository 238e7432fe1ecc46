-- Orphan reclaim. KEYS[1] = expiry index. ARGV[1] = key prefix, ARGV[2] = batch size,
-- ARGV[3] = retention (ms), ARGV[4] = how far the participant's clock is ahead of the host's
-- (ms; zero outside test mode). Releases held records whose hold_until is before the Redis
-- clock moved by that much (state `hold_lost`, units back to available, expiring at
-- hold_until + retention). Returns how many were released.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now), 'LIMIT', 0, tonumber(ARGV[2]))
local count = 0
for _, rec in ipairs(due) do
  redis.call('ZREM', KEYS[1], rec)
  if redis.call('HGET', rec, 's') == 'held' then
    local n = tonumber(redis.call('HGET', rec, 'n') or '0')
    for i = 1, n do
      local res = redis.call('HGET', rec, 'i' .. i)
      local q = redis.call('HGET', rec, 'q' .. i)
      redis.call('INCRBY', ARGV[1] .. 'a:' .. res, q)
      redis.call('DECRBY', ARGV[1] .. 'h:' .. res, q)
    end
    redis.call('HSET', rec, 's', 'hold_lost')
    local u = tonumber(redis.call('HGET', rec, 'u') or '0')
    redis.call('PEXPIREAT', rec, string.format('%d', u + tonumber(ARGV[3])))
    count = count + 1
  end
end
return count
