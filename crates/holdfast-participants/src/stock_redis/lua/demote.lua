-- Demotes a confirm of a lost epoch. KEYS[1] = branch record. ARGV[1] = the old epoch.
-- Returns 1 if the record was `confirmed` under that epoch and is now `hold_lost`.
if redis.call('HGET', KEYS[1], 's') == 'confirmed' and redis.call('HGET', KEYS[1], 'e') == ARGV[1] then
  redis.call('HSET', KEYS[1], 's', 'hold_lost')
  return 1
end
return 0
