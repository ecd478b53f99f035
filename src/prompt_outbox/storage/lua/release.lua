--[[
  Release: compare-and-delete the lock (only its holder may), then re-derive the indexes.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    lock value
    ARGV[3]    now, ms

  Output:
    {'ok', m}     released
    {'lost', m}   the caller did not hold it (the lease lapsed); the indexes are still refreshed
    m: the session's ready score (ms) if the release moved it earlier, else ''
       (the caller then marks the workspace in the due index)

  Events: none.
]]
local ses, lockval, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local before = ready_of(KEYS, ses)
local held = holds(KEYS, lockval)
if held then redis.call('DEL', KEYS[L]) end
refresh_head(KEYS, ses, now)
if held then return {'ok', lowered(KEYS, ses, before)} end
return {'lost', lowered(KEYS, ses, before)}
