-- Complete (the cross-list claim): remove every copy of the entry from queue and staging.
-- Only the completer whose call removed a copy fires OnDelivered, so concurrent completers
-- (sync path, verified path, another replica) fire it once. The claim marker remembers who
-- claimed, so a completer that retries after a lost reply still learns that it was the one.
-- Refused (-1) while ANOTHER holder owns the session: that holder decides this entry's fate,
-- unless the marker says this caller's earlier call already claimed it.
-- KEYS: session keys + [8] claim marker. ARGV: ses, id, lockval, now_ms, release, marker_ttl_ms.
local ses, id, lockval, now, release = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local cur = redis.call('GET', KEYS[L])
if cur and cur ~= lockval then
  -- Our earlier call may have claimed it (its reply lost, our lease lapsed since): still ours.
  if redis.call('GET', KEYS[8]) == lockval then return 1 end
  return -1
end
local removed = remove_id(KEYS[Q], id) + remove_id(KEYS[D], id)
if removed > 0 then
  redis.call('SET', KEYS[8], lockval, 'PX', ARGV[6])
  emit(KEYS, 'sent', id, '')
elseif redis.call('GET', KEYS[8]) == lockval then
  removed = 1
end
if cur and release == '1' then redis.call('DEL', KEYS[L]) end
refresh(KEYS, ses, now)
return removed
