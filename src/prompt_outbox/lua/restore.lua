-- Restore: put a staged entry back in its place in the queue with its new state, reinserting
-- into the queue BEFORE removing from staging. Refused ('lost') when another holder owns the
-- session, and a no-op ('gone') when the staged copy is no longer there (recovered meanwhile).
-- ARGV: ses, lockval, staged, new, now_ms, release.
local ses, lockval, staged, new = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, release = tonumber(ARGV[5]), ARGV[6]
local cur = redis.call('GET', KEYS[L])
if cur and cur ~= lockval then return 'lost' end
if not redis.call('LPOS', KEYS[D], staged) then return 'gone' end
insert_in_place(KEYS[Q], new)
redis.call('LREM', KEYS[D], 1, staged)
emit_state(KEYS, new)
if cur and release == '1' then redis.call('DEL', KEYS[L]) end
refresh(KEYS, ses, now)
return 'ok'
