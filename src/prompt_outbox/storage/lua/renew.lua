--[[
  Renew: extend the holder's lease, and the session's ready score with it.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    lock value
    ARGV[3]    lease, ms
    ARGV[4]    now, ms

  Output:
    {'ok'}     renewed
    {'lost'}   the caller no longer holds the lock (the lease lapsed); nothing written

  Events: none.
]]
local ses, lockval, lease, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if not holds(KEYS, lockval) then return {'lost'} end
take_lock(KEYS, ses, lockval, lease, now)
return {'ok'}
