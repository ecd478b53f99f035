--[[
  Lock: take the session lock for an operator pass (the ledger sweep) if nobody else holds it.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    lock value
    ARGV[3]    lease, ms
    ARGV[4]    now, ms

  Output:
    {'ok'}     the lock is held by the caller
    {'busy'}   another holder owns the session; nothing written

  Events: none.
]]
local ses, lockval, lease, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if held_by_other(KEYS, lockval) then return {'busy'} end
take_lock(KEYS, ses, lockval, lease, now)
return {'ok'}
