-- Release: compare-and-delete the lock (only its holder may), then re-derive the indexes.
-- ARGV: ses, lockval, now_ms.
local ses, lockval, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local held = redis.call('GET', KEYS[L]) == lockval
if held then redis.call('DEL', KEYS[L]) end
refresh(KEYS, ses, now)
return held and 1 or 0
