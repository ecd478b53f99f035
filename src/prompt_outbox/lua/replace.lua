-- Replace: compare-and-swap whole entry strings (operator actions, verification outcomes).
-- Each pair (old, new) swaps the exact string old for new in place, or removes it when new is
-- ''. Entries are found by value, never by a remembered index, so a concurrent change can
-- only make a pair miss (not counted), never hit a neighbour. Refused (-1) while another
-- holder owns the session: contention is reported as busy, never as absence.
-- ARGV: ses, lockval ('' = none), now_ms, release, old_1, new_1, old_2, new_2, ...
local ses, lockval, now, release = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local cur = redis.call('GET', KEYS[L])
if cur and cur ~= lockval then return -1 end
local done = 0
for i = 5, #ARGV, 2 do
  local old, new = ARGV[i], ARGV[i + 1]
  local list = KEYS[Q]
  local idx = redis.call('LPOS', list, old)
  if not idx then
    list = KEYS[D]
    idx = redis.call('LPOS', list, old)
  end
  if idx then
    if new == '' then
      redis.call('LREM', list, 1, old)
      local e = decode(old)
      if e then emit(KEYS, 'dismissed', e.id, '') end
    else
      redis.call('LSET', list, idx, new)
      emit_state(KEYS, new)
    end
    done = done + 1
  end
end
if cur and release == '1' then redis.call('DEL', KEYS[L]) end
refresh(KEYS, ses, now)
return done
