--[[
  Stage-out: copy the head into staging BEFORE removing it from the queue, so a failure in
  between leaves the entry in both lists (a possible duplicate, never a loss). The entry
  count (KEYS[8]) stays: the entry moves from one list to the other. (A failure between the
  two writes leaves the count one short until the session's next script counts again.)

  With ARGV[4], it also forgets an OnDelivered call owed that has run (notified.lua's work,
  riding on the next stage instead of a round trip of its own), whatever the stage's outcome:
  the hook ran, and forgetting is idempotent.

  Input:
    KEYS[1..8] session keys
    KEYS[9]    owed OnDelivered calls (HASH)
    KEYS[10]   their due times (ZSET)
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
  redis.call('ZREM', KEYS[10], ran)
  redis.call('HDEL', KEYS[9], ran)
end
if not holds(KEYS, lockval) then return {'lost'} end
if not redis.call('LPOS', KEYS[Q], original) then return {'gone'} end
redis.call('RPUSH', KEYS[D], staged)
redis.call('LREM', KEYS[Q], 1, original)
emit_state(KEYS, staged)
return {'ok'}
