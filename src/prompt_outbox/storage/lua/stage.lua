--[[
  Stage-out: copy the head into staging BEFORE removing it from the queue, so a failure in
  between leaves the entry in both lists (a possible duplicate, never a loss).

  With ARGV[4], it also forgets an OnDelivered call owed that has run (notified.lua's work,
  riding on the next stage instead of a round trip of its own), whatever the stage's outcome:
  the hook ran, and forgetting is idempotent.

  Input:
    KEYS[1..7] session keys
    KEYS[8]    owed OnDelivered calls (HASH)
    KEYS[9]    their due times (ZSET)
    ARGV[1]    lock value
    ARGV[2]    the entry as it stands in the queue
    ARGV[3]    the staged copy (status delivering, lastAttemptAt = the send window's start)
    ARGV[4]    member "<ses>:<entry id>" of an owed call that has run, or ''

  Output:
    {'ok'}     staged
    {'lost'}   the caller no longer holds the lock; nothing written
    {'gone'}   the entry is no longer in the queue; nothing written

  Events: delivering.
]]
local lockval, original, staged, ran = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if ran ~= '' then
  redis.call('ZREM', KEYS[9], ran)
  redis.call('HDEL', KEYS[8], ran)
end
if not holds(KEYS, lockval) then return {'lost'} end
if not redis.call('LPOS', KEYS[Q], original) then return {'gone'} end
redis.call('RPUSH', KEYS[D], staged)
redis.call('LREM', KEYS[Q], 1, original)
emit_state(KEYS, staged)
return {'ok'}
