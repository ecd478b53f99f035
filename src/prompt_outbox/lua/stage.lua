-- Stage-out: copy the head into staging BEFORE removing it from the queue, so a failure in
-- between leaves the entry in both lists (a possible duplicate, never a loss).
-- ARGV: lockval, original (as in the queue), staged (status delivering, send window start).
local lockval, original, staged = ARGV[1], ARGV[2], ARGV[3]
if redis.call('GET', KEYS[L]) ~= lockval then return 'lost' end
if not redis.call('LPOS', KEYS[Q], original) then return 'gone' end
redis.call('RPUSH', KEYS[D], staged)
redis.call('LREM', KEYS[Q], 1, original)
emit_state(KEYS, staged)
return 'ok'
