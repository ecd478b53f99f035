-- Take notices: OnDelivered calls owed by claims whose worker did not clear them in time
-- (it died after the claim). Each one taken is pushed grace_ms into the future in the same
-- step, so two workers never take the same one at once. KEYS: notices, notices due.
-- ARGV: now_ms, grace_ms, limit. Returns member, entry JSON, member, entry JSON...
local now, grace, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)) do
  local entry = redis.call('HGET', KEYS[1], member)
  if entry then
    redis.call('ZADD', KEYS[2], now + grace, member)
    table.insert(out, member)
    table.insert(out, entry)
  else
    redis.call('ZREM', KEYS[2], member)
  end
end
return out
