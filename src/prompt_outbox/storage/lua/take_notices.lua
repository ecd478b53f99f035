--[[
  Take notices: OnDelivered calls owed by claims whose worker did not clear them in time (it
  died after the claim). Each one taken is pushed grace ms into the future in the same step,
  so two workers never take the same one at once.

  Input:
    KEYS[1]    owed OnDelivered calls (HASH)
    KEYS[2]    their due times (ZSET)
    ARGV[1]    now, ms
    ARGV[2]    grace, ms
    ARGV[3]    at most this many

  Output:
    {'ok', member_1, entry_1, member_2, entry_2, ...}   members are "<ses>:<entry id>"

  Events: none.
]]
local now, grace, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {'ok'}
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
