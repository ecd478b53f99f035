--[[
  Complete (the cross-list claim): remove every copy of the entry from queue and staging.
  Only the completer whose call removed a copy fires OnDelivered, so concurrent completers
  (sync path, verified path, another replica) fire it once. The claim marker remembers who
  claimed, so a completer that retries after a lost reply still learns that it was the one.
  Refused unless the caller holds the session's lock (fence): while another holder owns it
  (that holder decides this entry's fate), and when nobody does (the caller's lease lapsed:
  another worker may have recovered the entry and be about to verify it), unless the marker
  says this caller's earlier call already claimed it.
  With a hook wired (grace > 0) the claim also records the OnDelivered call it now owes, in
  the same step: a worker killed before its hook ran leaves the record, and another worker
  fires the hook after grace ms (notified.lua clears the record once the hook ran).
  Each copy removed takes one entry of its own status off the tally (tally_removed); a
  pending one makes the queue's next pending entry the oldest.

  Input:
    KEYS[1..10] session keys
    KEYS[11]   claim marker outboxclaim:{ws}:{ses}:<id>
    KEYS[12]   owed OnDelivered calls (HASH)
    KEYS[13]   their due times (ZSET)
    KEYS[14]   the workspace's turns by owner (HASH session -> owner)
    KEYS[15]   the session's early end (STRING: a turn ID ended before it was held)
    KEYS[16]   the workspace's sessions in turn (ZSET session -> its lock's lapse, server ms)
    ARGV[1]    session ID
    ARGV[2]    entry ID
    ARGV[3]    lock value
    ARGV[4]    now, ms
    ARGV[5]    claim marker TTL, ms
    ARGV[6]    the entry JSON the hook gets
    ARGV[7]    grace, ms (0: no hook wired, record nothing)
    ARGV[8]    lease, ms, for the caller's next step (0: the caller takes no next step)
    ARGV[9]    the turn's value (core/turns.py), or '': the agent works on the prompt, and
               the claim hands the session's lock to the turn instead of a next step
               (ARGV[8] is then 0)
    ARGV[10]   the turn's hold, ms: the lock's expiry while in turn
    ARGV[11]   the turn's owner ('' none): recorded in KEYS[14], where a worker that finds
               the owner dead looks for the turns to release
    ARGV[12]   the turn's ID: when KEYS[15] names it, the turn ended before this claim (its
               end outran it), and none is held

  Output:
    {'ok'}     this caller claimed it (now, or in an earlier call whose reply was lost)
    {'ok', ...} the same, and (ARGV[8] > 0, the caller holding the lock) its next step in the
               same call: acquire.lua's reply without 'busy' ('staged' / 'head' with the lock
               re-leased, 'wait' / 'idle' with it released): BullMQ's moveToFinished, which
               fetches the next job, saves the worker an acquire per entry
    {'busy'}   another holder owns the session; nothing written
    {'lost'}   nobody holds the session (the caller's lease lapsed); nothing written
    {'ok', 'ended'} claimed, with a turn that had ended already (KEYS[15]): the caller
               still holds the lock, and goes on as after a claim without a turn
    {'gone'}   no copy was left and the claim is not this caller's

  Events: sent (only when a copy was removed), then turn (a turn began: its value), and
  turn_ended at once for a turn that had ended already. Series: delivered, when a copy was
  removed (lib.lua series).
]]
local ses, id, lockval, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local entry, grace, lease = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local turn = ARGV[9] or ''
local mine = redis.call('GET', KEYS[11]) == lockval
local refused = fence(KEYS, lockval)
if refused then
  -- Our earlier call may have claimed it (its reply lost, our lease lapsed since): still ours.
  if mine then return {'ok'} end
  return {refused}
end
-- The tally as it stood (nil if it did not add up): the removal moves it.
local staged = redis.call('LLEN', KEYS[D])
local T = tally()
local before = T.before(KEYS, ses, redis.call('LLEN', KEYS[Q]) + staged)
-- Staging, then the queue up to its head: every copy a stage, restore or recovery can leave
-- sits there (they insert at or before the head). Only when neither holds one (the claim of
-- an error entry further back, or of nothing) is the whole queue read.
local from_d, error_d, gone_d, bytes_d = remove_id(KEYS[D], id, false)
local from_q, error_q, gone_q, bytes_q = remove_id(KEYS[Q], id, true)
if from_d + from_q == 0 then
  from_q, error_q, gone_q, bytes_q = remove_id(KEYS[Q], id, false)
end
local removed = from_d + from_q
if removed > 0 then
  resized(KEYS, ses, -(bytes_d + bytes_q))
  redis.call('SET', KEYS[11], lockval, 'PX', ARGV[5])
  budget().markers_spent(KEYS, KEYS[11], lockval)
  if grace > 0 then
    redis.call('HSET', KEYS[12], ses .. ':' .. id, entry)
    redis.call('ZADD', KEYS[13], now + grace, ses .. ':' .. id)
  end
  emit(KEYS, 'sent', id, '')
end
local claimed = removed > 0 or mine
local early = false
if claimed and turn ~= '' and removed == 0 and redis.call('GET', KEYS[L]) == lockval then
  -- A retry of our own claim (its reply lost) that still holds our token, not the turn:
  -- the first call found the turn ended early. It stays so (no turn held twice).
  early = true
elseif claimed and turn ~= '' and redis.call('GET', KEYS[15]) == ARGV[12] then
  redis.call('DEL', KEYS[15])
  early = true
  emit(KEYS, 'turn', id, turn)
  emit_turn_ended(KEYS, id, ARGV[12], 0, 'ended')
elseif claimed and turn ~= '' then
  -- The session is now the turn's: held, by no worker, until the turn ends.
  redis.call('SET', KEYS[L], turn, 'PX', ARGV[10])
  if ARGV[11] ~= '' then redis.call('HSET', KEYS[14], ses, ARGV[11]) end
  -- Among the workspace's sessions in turn, scored by when this lock lapses at the latest:
  -- by the server's clock, as the lock's expiry is. Lapsed members go here (a turn's end
  -- takes its own off), and the key expires with the last lock it can name. The metrics'
  -- in-turn count checks each member's lock (storage/walk.py): O(sessions in turn).
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local hold = tonumber(ARGV[10])
  redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', at)
  redis.call('ZADD', KEYS[16], at + hold, ses)
  if redis.call('PTTL', KEYS[16]) < hold then redis.call('PEXPIRE', KEYS[16], hold) end
  emit(KEYS, 'turn', id, turn)
end
if removed > 0 and not (error_d or error_q) then
  -- Each copy removed leaves its own status (refresh() below derives it all instead).
  for _, s in ipairs(gone_q) do table.insert(gone_d, s) end
  T.removed(KEYS, ses, before, gone_d, from_d > 0, staged - from_d)
end
if error_d or error_q then
  refresh(KEYS, ses, now)
elseif lease == 0 or not claimed then
  -- (With a next step, next_step() keeps the indexes: 'staged' / 'head' leave the session
  -- holding entries and move the ready score to the new lease; 'wait' / 'idle' refresh.)
  refresh_head(KEYS, ses, now)
elseif removed > 0 then
  -- ...but not the count: 'staged' / 'head' derive nothing.
  recount(KEYS, ses)
end
if removed > 0 then series(KEYS, now, 2, 1) end
if not claimed then return {'gone'} end
if early then return {'ok', 'ended'} end
if lease > 0 then
  local reply = next_step(KEYS, ses, lockval, lease, now, lockval)
  table.insert(reply, 1, 'ok')
  return reply
end
return {'ok'}
