-- Lock: take the session lock for an operator pass (sweeps) if nobody holds it. 1 = taken.
-- ARGV: ses, lockval, lease_ms, now_ms.
local ses, lockval, lease, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('GET', KEYS[L])
if cur and cur ~= lockval then return 0 end
take_lock(KEYS, ses, lockval, lease, now)
return 1
