--[[
  Accept a prompt: dedupe first, then the memory ceiling, then the caps (the session's, then
  the workspace's entries, then its byte budget), then push, and only THEN the dedupe marker
  (a marker without its entry would turn every client retry into a false duplicate) and the
  payload's fingerprint beside it (a marker without one, as written before fingerprints,
  makes a duplicate whatever the payload). The workspace's count and tally move with the push
  (index_pushed, tally_pushed), in O(1).

  Input:
    KEYS[1..10] session keys (queue, staging, lock, ready, sessions, errors, events, count,
                oldest, log bytes)
    KEYS[11]   dedupe marker outboxdedupe:{ws}:{ses}:<cmid>
    KEYS[12]   payload fingerprint outboxdedupefp:{ws}:{ses}:<cmid>
    ARGV[1]    session ID
    ARGV[2]    entry JSON (status pending)
    ARGV[3]    entry ID
    ARGV[4]    cap: queued plus staged entries allowed
    ARGV[5]    dedupe TTL, ms
    ARGV[6]    1: a WAITAOF follows on this connection; a duplicate writes its marker again
               (same value, same expiry), as confirm.lua does, so the wait covers the
               first accept too. 0: a duplicate writes nothing.
    ARGV[7]    this accept's payload fingerprint (text and model)
    ARGV[8]    whileBusy: 'enqueue' behind what the session holds; 'reject': refuse when
               the session holds a pending, delivering or verifying entry, or is in turn;
               'interrupt': enqueue, and name the entry being delivered (staged), whose turn
               the caller asks the deliverer to abort; in turn, name the turn's entry and
               ask the abort of its next check, made due now
    ARGV[9]    workspace cap: entries allowed over all the workspace's sessions (the total
               of KEYS[8], which every session script keeps exact)
    ARGV[10]   1: the node's memory is at the accept ceiling (storage/memory.py read it):
               refuse; 0: go on
    ARGV[11]   the entry's acceptedAt, ms (the tally's oldest pending, without decoding it)
    ARGV[12]   the workspace's byte budget: what its queued entries (KEYS[8]'s BYTES_TOTAL,
               kept by resized), its event logs and its markers (KEYS[10], kept by emit and
               budget().markers_spent) may take before its accepts stop (0: no budget)

  Output:
    {'ok'[, staged id]}    pushed, marker set; for 'interrupt', the ID of the entry being
                           delivered, if one is. And a second value, true, when the session was
                           ready already (a holder, staging or a blocking head: the entry waits
                           behind them), so no work became due sooner (marked.lua skips the mark)
    {'duplicate', id}      the marker names the first accept's entry ID, for the same payload;
                           nothing written but the marker again (ARGV[6])
    {'reused', id}         the marker names entry id, accepted for ANOTHER payload: the key was
                           reused; nothing written
    {'storage_full'}       ARGV[10]: no room for new entries; nothing written
    {'rejected'}           ARGV[8] and the session is busy (staging, or a blocking entry in the
                           queue); nothing written
    {'full', n}            the session holds n >= cap entries; nothing written
    {'workspace_full', n}  the workspace holds n >= ARGV[9] entries; nothing written
    {'bytes_full', used, queued, logs, markers, ms}
                           the workspace holds `used` bytes (queued entries, event logs and
                           markers), and this entry would take it past ARGV[12]; ms until the
                           windows passing bring it under (0: only deliveries can); nothing
                           written
    Every answer but 'ok' also returns true second: no work became due sooner.

  Events: accepted. Series: accepted (lib.lua series, outboxseries:{ws}).
]]
local ses, entry, id = ARGV[1], ARGV[2], ARGV[3]
local cap, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local prev = redis.call('GET', KEYS[11])
if prev then
  local first = redis.call('GET', KEYS[12])
  if first and first ~= ARGV[7] then return {'reused', prev}, true end
  if ARGV[6] == '1' then redis.call('SET', KEYS[11], prev, 'KEEPTTL') end
  return {'duplicate', prev}, true
end
-- After the dedupe: a retry of an accept that was taken is its duplicate, full or busy or not.
if ARGV[10] == '1' then return {'storage_full'}, true end
local turn = nil
if ARGV[8] ~= 'enqueue' and turn_check_ms(redis.call('GET', KEYS[L])) then
  turn = redis.call('GET', KEYS[L])
end
if ARGV[8] == 'reject' and (turn or redis.call('LLEN', KEYS[D]) > 0 or find_head(KEYS[Q])) then
  return {'rejected'}, true
end
local n = redis.call('LLEN', KEYS[Q]) + redis.call('LLEN', KEYS[D])
if n >= cap then return {'full', n}, true end
-- O(1): the count's total field, kept by index() in every session script (lib.lua).
local total = tonumber(redis.call('HGET', KEYS[COUNT], COUNT_TOTAL) or '0')
if total >= tonumber(ARGV[9]) then return {'workspace_full', total}, true end
-- O(1) too: five fields of the counts (lib.lua budget().over).
local over = budget().over(KEYS, tonumber(ARGV[12]), #entry)
if over then
  table.insert(over, 1, 'bytes_full')
  return over, true
end
redis.call('RPUSH', KEYS[Q], entry)
resized(KEYS, ses, entry_bytes(entry))
emit(KEYS, 'accepted', id, entry)
redis.call('SET', KEYS[11], id, 'PX', ttl)
redis.call('SET', KEYS[12], ARGV[7], 'PX', ttl)
budget().markers_spent(KEYS, KEYS[11], id, KEYS[12], ARGV[7])
tally().pushed(KEYS, ses, n, tonumber(ARGV[11]))
series(KEYS, tonumber(ARGV[11]), 1, 1)
-- A new entry has no nextAttemptAt: due at once (0) once it is the head.
local readied = index_pushed(KEYS, ses, n, 0)
if ARGV[8] == 'interrupt' and turn then
  -- In turn: the abort is asked at the turn's next check, which is now (core/turns.py).
  local record = turn_record(turn)
  if record then
    record.abort = true
    redis.call('SET', KEYS[L], string.format('turn:%d:', 0) .. cjson.encode(record), 'KEEPTTL')
    redis.call('ZADD', KEYS[READY], tonumber(ARGV[11]), ses)
    return {'ok', tostring(record.entry)}, false
  end
end
if ARGV[8] == 'interrupt' then
  local staged = decode(redis.call('LINDEX', KEYS[D], 0) or '')
  if staged and type(staged.id) == 'string' then return {'ok', staged.id}, not readied end
end
return {'ok'}, not readied
