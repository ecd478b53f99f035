--[[
  Restore: put a staged entry back in its place in the queue with its new state, reinserting
  into the queue BEFORE removing from staging (a failure between leaves both copies; recovery
  keeps one, by ID).

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    lock value
    ARGV[3]    the staged copy, exactly as in staging
    ARGV[4]    the entry's new state (pending, verifying or error)
    ARGV[5]    now, ms

  Output:
    {'ok'}     restored
    {'busy'}   another holder owns the session; nothing written
    {'lost'}   nobody holds it (the caller's lease lapsed; see fence); nothing written
    {'gone'}   the staged copy is no longer there (recovered meanwhile); nothing written

  Events: the new status (pending, verifying or error). Series: failed, for error; else the oldest pending, if
  this moved it (lib.lua series_moved).
]]
local ses, lockval, staged, new, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local refused = fence(KEYS, lockval)
if refused then return {refused} end
if not redis.call('LPOS', KEYS[D], staged) then return {'gone'} end
insert_in_place(KEYS[Q], new)
redis.call('LREM', KEYS[D], 1, staged)
local e = emit_state(KEYS, new)
refresh(KEYS, ses, now)
-- From staging (delivering) into error: a failed prompt.
if e and e.status == 'error' then
  series(KEYS, now, 3, 1)
else
  series_moved(KEYS, now)
end
return {'ok'}
