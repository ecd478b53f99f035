-- Renew: extend the holder's lease (and the session's ready score with it). 0 = lease lost.
-- ARGV: ses, lockval, lease_ms, now_ms.
local ses, lockval, lease, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('GET', KEYS[L]) ~= lockval then return 0 end
take_lock(KEYS, ses, lockval, lease, now)
return 1
