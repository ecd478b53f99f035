--[[
  Stage-out: copy the head into staging BEFORE removing it from the queue, so a failure in
  between leaves the entry in both lists (a possible duplicate, never a loss).

  Input:
    KEYS[1..7] session keys
    ARGV[1]    lock value
    ARGV[2]    the entry as it stands in the queue
    ARGV[3]    the staged copy (status delivering, lastAttemptAt = the send window's start)

  Output:
    {'ok'}     staged
    {'lost'}   the caller no longer holds the lock; nothing written
    {'gone'}   the entry is no longer in the queue; nothing written

  Events: delivering.
]]
local lockval, original, staged = ARGV[1], ARGV[2], ARGV[3]
if not holds(KEYS, lockval) then return {'lost'} end
if not redis.call('LPOS', KEYS[Q], original) then return {'gone'} end
redis.call('RPUSH', KEYS[D], staged)
redis.call('LREM', KEYS[Q], 1, original)
emit_state(KEYS, staged)
return {'ok'}
