-- Acquire: take the session lock (re-entrant for its holder) and say what is to be done.
--   busy          another holder; the ready score moves to its lease expiry
--   staged, e...  staging is non-empty: a dead worker's entries, to recover first
--   head, e       the first blocking entry is due: the lock is now held
--   wait, ms      the head is not due until ms; the lock is released
--   idle          nothing blocks; the lock is released
-- ARGV: ses, lockval, lease_ms, now_ms.
local ses, lockval, lease, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('GET', KEYS[L])
if cur and cur ~= lockval then
  refresh(KEYS, ses, now)
  return {'busy'}
end
local staged = redis.call('LRANGE', KEYS[D], 0, -1)
if #staged > 0 then
  take_lock(KEYS, ses, lockval, lease, now)
  table.insert(staged, 1, 'staged')
  return staged
end
local raw, due = find_head(KEYS[Q])
if raw and due <= now then
  take_lock(KEYS, ses, lockval, lease, now)
  return {'head', raw}
end
if cur then redis.call('DEL', KEYS[L]) end
refresh(KEYS, ses, now)
if raw then return {'wait', string.format('%d', due)} end
return {'idle'}
