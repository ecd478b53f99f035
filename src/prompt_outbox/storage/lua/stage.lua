--[[
  Stage-out: copy the head into staging BEFORE removing it from the queue, so a failure in
  between leaves the entry in both lists (a possible duplicate, never a loss). The entry
  count (KEYS[8]) stays: the entry moves from one list to the other. (A failure between the
  two writes leaves the count one short until the session's next script counts again.) Its
  queued bytes move by what the staged copy adds (resized). The tally moves from the entry's
  old status to delivering, with its send start; when the entry was pending, the oldest
  pending is the queue's next pending entry (tally_staged).

  With ARGV[4], it also forgets an OnDelivered call owed that has run (notified.lua's work,
  riding on the next stage instead of a round trip of its own), whatever the stage's outcome:
  the hook ran, and forgetting is idempotent.

  Input:
    KEYS[1..10] session keys
    KEYS[11]   owed OnDelivered calls (HASH)
    KEYS[12]   their due times (ZSET)
    ARGV[1]    session ID
    ARGV[2]    lock value
    ARGV[3]    the entry as it stands in the queue
    ARGV[4]    the staged copy (status delivering, lastAttemptAt = the send window's start)
    ARGV[5]    member "<ses>:<entry id>" of an owed call that has run, or ''

  Output:
    {'ok'}     staged
    {'lost'}   the caller no longer holds the lock; nothing written
    {'gone'}   the entry is no longer in the queue; nothing written

  Events: delivering. Series: the oldest pending, when staging the workspace's oldest moved
  it (lib.lua series_moved), at the staged copy's lastAttemptAt (the caller's clock now).
]]
local ses, lockval, original, staged, ran = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if ran ~= '' then
  redis.call('ZREM', KEYS[12], ran)
  redis.call('HDEL', KEYS[11], ran)
end
if not holds(KEYS, lockval) then return {'lost'} end
if not redis.call('LPOS', KEYS[Q], original) then return {'gone'} end
-- Staging is empty here but after a failure; then the tally is derived (before is nil).
local T, before = tally(), nil
if redis.call('LLEN', KEYS[D]) == 0 then
  before = T.before(KEYS, ses, redis.call('LLEN', KEYS[Q]))
end
redis.call('RPUSH', KEYS[D], staged)
redis.call('LREM', KEYS[Q], 1, original)
resized(KEYS, ses, #staged - #original)
local e = emit_state(KEYS, staged)
T.staged(KEYS, ses, before, T.status_of(original), e)
-- No clock of its own: the staged copy's send start is the caller's now (an undecodable copy
-- leaves the move to the next recorded change).
local at = e and parse_ms(e.lastAttemptAt)
if at and at > 0 then series_moved(KEYS, at) end
return {'ok'}
