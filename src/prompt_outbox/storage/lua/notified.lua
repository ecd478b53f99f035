--[[
  Notified: the OnDelivered calls claims owed have run; forget them.

  Input:
    KEYS[1]    owed OnDelivered calls (HASH)
    KEYS[2]    their due times (ZSET)
    ARGV[1..n] members "<ses>:<entry id>", one or more (of KEYS[1]'s workspace)

  Output:
    {'ok'}     at least one record was there; each named one is gone
    {'gone'}   there was no record

  Events: none.
]]
local found = 0
for i = 1, #ARGV do
  redis.call('ZREM', KEYS[2], ARGV[i])
  found = found + redis.call('HDEL', KEYS[1], ARGV[i])
end
if found > 0 then return {'ok'} end
return {'gone'}
