--[[
  Notified: the OnDelivered call a claim owed has run; forget it.

  Input:
    KEYS[1]    owed OnDelivered calls (HASH)
    KEYS[2]    their due times (ZSET)
    ARGV[1]    member "<ses>:<entry id>"

  Output:
    {'ok'}     the record was there and is gone
    {'gone'}   there was no record

  Events: none.
]]
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then return {'ok'} end
return {'gone'}
