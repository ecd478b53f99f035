--[[
  Replace: compare-and-swap whole entry strings (operator actions, verification outcomes).
  Each pair (old, new) swaps the exact string old for new in place, or removes it when new is
  ''. Entries are found by value, never by a remembered index, so a concurrent change can only
  make a pair miss (not counted), never hit a neighbour. Refused while another holder owns the
  session: contention is reported as busy, never as absence. A caller that passes a lock value
  must hold that lock (fence): a worker whose lease lapsed gets 'lost'. A client's retry
  (ARGV[4]) is refused, as an accept is, while the workspace is at its byte budget: it
  re-arms entries for more moves, each logging the whole entry.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    lock value ('' for an operator that holds no lock)
    ARGV[3]    now, ms
    ARGV[4]    the workspace's byte budget (as accept.lua's ARGV[12]), or 0: no such bound
               (every move but a client's retry)
    ARGV[5..]  old_1, new_1, old_2, new_2, ... (new '' removes old)

  Output:
    {'ok', n}  n pairs applied (a pair whose old string is gone is skipped)
    {'busy'}   another holder owns the session; nothing written
    {'lost'}   a lock value was given and nobody holds the lock; nothing written
    {'bytes_full', used, queued, logs, markers, ms}  ARGV[4] > 0, as accept.lua's; nothing
               written

  Events: the new status per swapped entry; dismissed per removed one. Series: failed, per
  entry moved into error (lib.lua series); else the oldest pending, if this moved it (a retry,
  dismiss, park or unpark: series_moved).
]]
local ses, lockval, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
if lockval == '' then
  if held_by_other(KEYS, lockval) then return {'busy'} end
else
  local refused = fence(KEYS, lockval)
  if refused then return {refused} end
end
local bound = tonumber(ARGV[4])
if bound > 0 then
  -- Each swapped entry is logged whole now, and again at each of its later moves.
  local incoming = 0
  for i = 6, #ARGV, 2 do incoming = incoming + #ARGV[i] end
  local over = budget().over(KEYS, bound, incoming)
  if over then
    table.insert(over, 1, 'bytes_full')
    return over
  end
end
local done, failed = 0, 0
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
      local e = emit_state(KEYS, new)
      if e and e.status == 'error' then
        local was = decode(old)
        if not (was and was.status == 'error') then failed = failed + 1 end
      end
    end
    done = done + 1
  end
end
refresh(KEYS, ses, now)
if failed > 0 then
  series(KEYS, now, 3, failed)
else
  series_moved(KEYS, now)
end
return {'ok', done}
