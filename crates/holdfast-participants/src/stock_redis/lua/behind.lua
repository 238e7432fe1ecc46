-- Takes the ready marker away from a data set behind the durable record. KEYS[1] = ready
-- marker, KEYS[2] = the data set's sequence of durable changes. ARGV[1] = the durable record's
-- highest sequence number. Returns 1 if the data set was ready and behind (the marker is gone:
-- every script refuses until the rebuild), else 0.
if redis.call('GET', KEYS[1]) and tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
