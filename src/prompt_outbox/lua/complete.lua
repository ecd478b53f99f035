-- Complete (the cross-list claim): remove every copy of the entry from queue and staging.
-- Only the completer whose call removed a copy fires OnDelivered, so concurrent completers
-- (sync path, verified path, another replica) fire it once. The claim marker remembers who
-- claimed, so a completer that retries after a lost reply still learns that it was the one.
-- Refused (-1) while ANOTHER holder owns the session: that holder decides this entry's fate,
-- unless the marker says this caller's earlier call already claimed it.
-- With a hook wired (grace_ms > 0) the claim also records the OnDelivered call it now owes, in
-- the same step: a worker killed before its hook ran leaves the record, and another worker
-- fires the hook after grace_ms (notified.lua clears the record once the hook ran).
-- KEYS: session keys + [8] claim marker, [9] notices, [10] notices due.
-- ARGV: ses, id, lockval, now_ms, release, marker_ttl_ms, entry (JSON), grace_ms.
local ses, id, lockval, now, release = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local entry, grace = ARGV[7], tonumber(ARGV[8])
local cur = redis.call('GET', KEYS[L])
if cur and cur ~= lockval then
  -- Our earlier call may have claimed it (its reply lost, our lease lapsed since): still ours.
  if redis.call('GET', KEYS[8]) == lockval then return 1 end
  return -1
end
local removed = remove_id(KEYS[Q], id) + remove_id(KEYS[D], id)
if removed > 0 then
  redis.call('SET', KEYS[8], lockval, 'PX', ARGV[6])
  if grace > 0 then
    redis.call('HSET', KEYS[9], ses .. ':' .. id, entry)
    redis.call('ZADD', KEYS[10], now + grace, ses .. ':' .. id)
  end
  emit(KEYS, 'sent', id, '')
elseif redis.call('GET', KEYS[8]) == lockval then
  removed = 1
end
if cur and release == '1' then redis.call('DEL', KEYS[L]) end
refresh(KEYS, ses, now)
return removed
