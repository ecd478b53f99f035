--[[
  Shared prelude, prepended to every script by storage/scripts.py (after the constants
  EVENTS_MAXLEN, EVENTS_TTL_MS, EVENTS_MAX_BYTES, MARKERS_TTL_MS, COUNT_TOTAL, BYTES_TOTAL,
  COUNT_SEP and STATUSES it defines). Not a transition itself.

  Session scripts take the same first ten KEYS (core/keys.py SessionKeys.script_keys), named
  by the constants below: queue, staging, lock, ready, sessions, errors, events, count, oldest,
  log bytes.

  Reply convention, for every script: a table whose first element is a status word, then its
  payload. The words: ok, busy (ANOTHER holder owns the session), lost (this caller's lock is
  not held), gone (what the caller meant to act on is no longer there), changed (the state the
  caller read has moved), and the per-script ones its header lists. storage/replies.py turns
  each reply into a typed value; an unknown word is an error there, never a silent default.

  Scripts never re-encode an entry: Python builds every entry string, scripts only move and
  compare whole strings (cjson would turn the caller's [] into {} and round big numbers), and
  decode them only to read id, status, acceptedAt, lastAttemptAt and nextAttemptAt.
]]

local Q, D, L, READY, SESSIONS, ERRORS, EVENTS, COUNT, OLDEST, LOGBYTES =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10

-- RFC 3339 -> epoch milliseconds; '' or missing means "due now" (0). Days-from-civil arithmetic.
local function parse_ms(s)
  if type(s) ~= 'string' or s == '' then return 0 end
  local y, mo, d, h, mi, sec, rest =
    string.match(s, '^(%d%d%d%d)%-(%d%d)%-(%d%d)[Tt ](%d%d):(%d%d):(%d%d)(.*)$')
  if not y then return 0 end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  local ms = 0
  local frac = string.match(rest, '^%.(%d+)')
  if frac then
    ms = tonumber(string.sub(frac .. '00', 1, 3))
    rest = string.sub(rest, #frac + 2)
  end
  local off = 0
  local sign, oh, om = string.match(rest, '^([+-])(%d%d):?(%d%d)$')
  if sign then
    off = (tonumber(oh) * 60 + tonumber(om)) * 60000
    if sign == '-' then off = -off end
  end
  if mo <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((mo + 9) % 12) + 2) / 5) + d - 1
  local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
  return ((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60000 + tonumber(sec) * 1000 + ms - off
end

local function decode(raw)
  local ok, e = pcall(cjson.decode, raw)
  if ok and type(e) == 'table' then return e end
  return nil
end

-- The lock's value and whether ANOTHER holder has it. A free lock is nobody's: callers that
-- only need "not someone else's" (complete, restore, replace) may write while it is free.
local function held_by_other(K, lockval)
  local cur = redis.call('GET', K[L])
  return (cur and cur ~= lockval) or false, cur
end

-- Whether this caller holds the lock (stage, requeue and renew need it held, not just free).
local function holds(K, lockval)
  return redis.call('GET', K[L]) == lockval
end

-- The fence on every write after a send (complete, restore, a locked replace): nil when the
-- caller holds the lock; 'busy' while another holder has it; 'lost' when nobody has it (the
-- caller's lease lapsed: a worker paused or cut off past it must not write the entry, since
-- another may already have recovered it and be about to verify it).
local function fence(K, lockval)
  local cur = redis.call('GET', K[L])
  if cur == lockval then return nil end
  if cur then return 'busy' end
  return 'lost'
end

-- A turn (core/turns.py): the lock's value while the agent works on a delivered prompt,
-- 'turn:<check ms>:<record JSON>'. Its check time (ms), or nil for a worker's token.
local function turn_check_ms(v)
  if type(v) ~= 'string' then return nil end
  local check = string.match(v, '^turn:(%d+):')
  return check and tonumber(check)
end

-- A turn value's record JSON: what follows its check time.
local function turn_body(v)
  return string.sub(v, string.find(v, ':', 6, true) + 1)
end

-- The turn value v with its check time moved to `check` (ms).
local function turn_checked(v, check)
  return string.format('turn:%d:', check) .. turn_body(v)
end

-- The record a turn value holds, decoded; nil for a worker's token (or a record that does
-- not decode).
local function turn_record(v)
  if not turn_check_ms(v) then return nil end
  return decode(turn_body(v))
end

-- What an entry counts for in its workspace's queued bytes (its budget): its string, and what
-- a list's node takes beside it, about.
local ENTRY_BYTES = 64
local function entry_bytes(raw)
  return #raw + ENTRY_BYTES
end

-- pending / verifying (and a delivering copy found in the queue) hold back the entries behind.
local function blocking(status)
  return status == 'pending' or status == 'verifying' or status == 'delivering'
end

-- Walk the queue from its head in growing slices, calling visit(raw, index0) for each entry
-- until visit returns true. Slices, not LRANGE 0 -1: the
-- delivery head is almost always the first entry, so a hot-path script reads one or a few
-- entries whatever the queue's length (only error / parked entries ahead of it are read too).
local function walk_raw(queue, visit)
  local start, size = 0, 1
  while true do
    local items = redis.call('LRANGE', queue, start, start + size - 1)
    for i, raw in ipairs(items) do
      if visit(raw, start + i - 1) then return true end
    end
    if #items < size then return false end
    start = start + size
    size = math.min(size * 4, 256)
  end
end

-- walk_raw(), each entry also decoded for visit(raw, e, index0).
local function walk(queue, visit)
  return walk_raw(queue, function(raw, i) return visit(raw, decode(raw), i) end)
end

-- The first blocking entry of the queue: raw string and due time (ms), or nil.
local function find_head(queue)
  local head, due
  walk(queue, function(raw, e, _)
    if e and blocking(e.status) then head, due = raw, parse_ms(e.nextAttemptAt) end
    return head ~= nil
  end)
  return head, due
end

-- 0-based index of the entry with this id in a list, or nil.
local function index_of_id(list, id)
  local at
  walk(list, function(_, e, i)
    if e and e.id == id then at = i end
    return at ~= nil
  end)
  return at
end

-- Remove every copy of the entry with this id from a list, or (head_only) from the queue's
-- entries up to and including its delivery head. Returns how many went, whether one of
-- them was an error entry (the errors index must then be re-derived), the status of each
-- (the tally moves by them), and the bytes they counted (entry_bytes).
local function remove_id(list, id, head_only)
  local found, statuses = {}, {}
  local had_error = false
  walk(list, function(raw, e, _)
    if e and e.id == id then
      table.insert(found, raw)
      table.insert(statuses, e.status)
      had_error = had_error or e.status == 'error'
    end
    return head_only and e ~= nil and blocking(e.status)
  end)
  local n, bytes = 0, 0
  for _, raw in ipairs(found) do
    local gone = redis.call('LREM', list, 1, raw)
    n, bytes = n + gone, bytes + gone * entry_bytes(raw)
  end
  return n, had_error, statuses, bytes
end

-- Put an entry back where it stood: before the first entry that blocks (the delivery head)
-- or that was accepted after it. Older error / parked entries stay in front: List is FIFO.
local function insert_in_place(queue, raw)
  local mine = decode(raw)
  local at = mine and parse_ms(mine.acceptedAt) or 0
  local before
  walk(queue, function(other, e, _)
    if e and (blocking(e.status) or parse_ms(e.acceptedAt) > at) then before = other end
    return before ~= nil
  end)
  if before then return redis.call('LINSERT', queue, 'BEFORE', before, raw) end
  return redis.call('RPUSH', queue, raw)
end

--[[ What the workspace has written that expires on its own (K[LOGBYTES], a HASH), for its
  byte budget (budget() below; docs/design.md, "What one tenant may store"):
    '<w>'        the bytes its sessions' event logs took in window w of EVENTS_TTL_MS (window =
                 the server's ms // the width). A log lives at most EVENTS_TTL_MS from its first
                 event (emit), so every byte the logs hold was logged in the current window or
                 the one before: their sum bounds what the logs hold.
    'm<w>'       the same for the dedupe markers (with their fingerprints) and the claim
                 markers, in windows of MARKERS_TTL_MS (the longest either lives).
    '<log key>'  one session's log as it stands: '<window of its first event>:<bytes>', the
                 bytes counted into the windows since it began, so that a log that begins again
                 (past EVENTS_MAX_BYTES) takes them off the windows.
  Windows need no subtraction for what expires: time does it. ]]

-- The server's time (ms), read once per script call (TIME: a script's own clock, the one the
-- logs' and markers' expiry runs on, whatever the caller's).
local clock_ms
local function server_ms()
  if not clock_ms then
    local t = redis.call('TIME')
    clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock_ms
end

local function window(width)
  return math.floor(server_ms() / width)
end

local spent  -- below: the budget's functions count markers with it, and it prunes with them

-- The budget's functions, made on a script's first call of budget() (as tally()'s): every
-- function the prelude makes costs every call of every script, and most never use these.
local budget_fns
local function budget()
  if budget_fns then return budget_fns end
  -- Drop what no check reads any more (windows before the previous one, the records of logs
  -- that began before it: they have expired), and let the key expire when the newest thing it
  -- holds stops counting. Run once per window's first bytes: O(the fields), a few per session
  -- that logged in the last two windows.
  local function prune_written(K)
    local wl, wm = window(EVENTS_TTL_MS), window(MARKERS_TTL_MS)
    local last = 0
    local fields = redis.call('HGETALL', K[LOGBYTES])
    for i = 1, #fields, 2 do
      local field, value = fields[i], fields[i + 1]
      local lw, mw = tonumber(field), tonumber(string.match(field, '^m(%d+)$'))
      local began = tonumber(string.match(value, '^(%d+):'))
      local ends
      if lw then
        if lw >= wl - 1 then ends = (lw + 2) * EVENTS_TTL_MS end
      elseif mw then
        if mw >= wm - 1 then ends = (mw + 2) * MARKERS_TTL_MS end
      elseif began and began >= wl - 1 then
        ends = (began + 2) * EVENTS_TTL_MS
      end
      if ends then
        last = math.max(last, ends)
      else
        redis.call('HDEL', K[LOGBYTES], field)
      end
    end
    if last > 0 then redis.call('PEXPIREAT', K[LOGBYTES], string.format('%d', last)) end
  end

  -- Take n bytes that a log held off the log windows, the previous one first: whatever window
  -- they were logged in, the sum keeps bounding what the logs hold, and so does the current
  -- window alone once the previous one drops out (it is never lowered by more than what it
  -- counted of them).
  local function unspent(K, n)
    local w = window(EVENTS_TTL_MS)
    for _, at in ipairs({w - 1, w}) do
      local field = string.format('%d', at)
      local take = math.min(n, tonumber(redis.call('HGET', K[LOGBYTES], field) or '0'))
      if take > 0 then
        redis.call('HINCRBY', K[LOGBYTES], field, -take)
        n = n - take
      end
    end
  end

  -- A dedupe or claim marker's key and value take this much more than their bytes (the key's
  -- entries in the keyspace and expiry tables, its object and headers).
  local MARKER_KEY_BYTES = 64

  -- Markers were written: each a key and a value, as (key, value, key, value, ...).
  local function markers_spent(K, ...)
    local n, kv = 0, {...}
    for i = 1, #kv, 2 do n = n + #kv[i] + #kv[i + 1] + MARKER_KEY_BYTES end
    spent(K, 'm', MARKERS_TTL_MS, n)
  end

  -- What the workspace holds against its budget: its queued bytes and what its event logs and
  -- markers took in the windows still counted ({w, w - 1} of each), read in O(1): one HMGET and
  -- one HGET. l0, l1, m0, m1: the current and previous windows' bytes of logs and markers.
  local function holding(K)
    local wl, wm = window(EVENTS_TTL_MS), window(MARKERS_TTL_MS)
    local got = redis.call('HMGET', K[LOGBYTES], string.format('%d', wl),
      string.format('%d', wl - 1), string.format('m%d', wm), string.format('m%d', wm - 1))
    return {
      queued = tonumber(redis.call('HGET', K[COUNT], BYTES_TOTAL) or '0'),
      l0 = tonumber(got[1]) or 0, l1 = tonumber(got[2]) or 0,
      m0 = tonumber(got[3]) or 0, m1 = tonumber(got[4]) or 0,
      wl = wl, wm = wm,
    }
  end

  -- nil while the workspace may take `incoming` bytes more within `budget` (0: no budget);
  -- else what it holds: {used, queued, logs, markers, ms, d}, ms being how long until the
  -- windows passing alone bring it under (0: they cannot), d 1 when deliveries, taking its
  -- queued bytes, could (0: only time can).
  local function over_budget(K, budget, incoming)
    if budget <= 0 then return nil end
    local h = holding(K)
    local used = h.queued + h.l0 + h.l1 + h.m0 + h.m1
    if used + incoming <= budget then return nil end
    -- A previous window stops counting at the next boundary, the current one at the one after.
    local drops = {
      {(h.wl + 1) * EVENTS_TTL_MS, h.l1}, {(h.wl + 2) * EVENTS_TTL_MS, h.l0},
      {(h.wm + 1) * MARKERS_TTL_MS, h.m1}, {(h.wm + 2) * MARKERS_TTL_MS, h.m0},
    }
    table.sort(drops, function(a, b) return a[1] < b[1] end)
    local left, clears = used + incoming, 0
    for _, d in ipairs(drops) do
      left = left - d[2]
      if left <= budget then
        clears = d[1] - server_ms()
        break
      end
    end
    local deliveries = used + incoming - h.queued <= budget and 1 or 0
    return {used, h.queued, h.l0 + h.l1, h.m0 + h.m1, clears, deliveries}
  end

  budget_fns = {
    prune = prune_written, unspent = unspent, markers_spent = markers_spent,
    holding = holding, over = over_budget,
  }
  return budget_fns
end

-- Count n bytes written now into the windows named by `prefix` ('' logs, 'm' markers) of
-- `width` ms.
function spent(K, prefix, width, n)
  local w = window(width)
  if redis.call('HINCRBY', K[LOGBYTES], prefix .. string.format('%d', w), n) == n then
    budget().prune(K)
  end
end

-- K[COUNT]'s `field` set to n (no field for 0), and its `total` field moved by the difference,
-- so that a total is always the sum of its fields: the total's new value (nil: unchanged).
local function counted(K, field, n, total)
  local before = tonumber(redis.call('HGET', K[COUNT], field) or '0')
  if n == before then return nil end
  if n > 0 then
    redis.call('HSET', K[COUNT], field, n)
  else
    redis.call('HDEL', K[COUNT], field)
  end
  return redis.call('HINCRBY', K[COUNT], total, n - before)
end

-- The workspace's queued bytes: what its sessions' queues and staging lists hold
-- (entry_bytes of each entry), kept per session in K[COUNT] ('<ses>|bytes') and in all
-- (BYTES_TOTAL): set from the lists by refresh() (sized), moved by the difference by the
-- scripts that change entries without it (resized: accept, stage, complete, edit).
local function sized(K, ses, bytes)
  local total = counted(K, ses .. COUNT_SEP .. 'bytes', bytes, BYTES_TOTAL)
  if total and total <= 0 then redis.call('HDEL', K[COUNT], BYTES_TOTAL) end
end

local function resized(K, ses, delta)
  if delta == 0 then return end
  local field = ses .. COUNT_SEP .. 'bytes'
  if redis.call('HINCRBY', K[COUNT], field, delta) <= 0 then redis.call('HDEL', K[COUNT], field) end
  if redis.call('HINCRBY', K[COUNT], BYTES_TOTAL, delta) <= 0 then
    redis.call('HDEL', K[COUNT], BYTES_TOTAL)
  end
end

-- Append to the session's event log in the same script as the change it reports, so a
-- reader never sees a change without its event, or an event without its change. kind is
-- 'accepted', 'sent', 'dismissed' or the entry's new status; raw is its new JSON ('' if gone).
-- The log expires EVENTS_TTL_MS after its FIRST event, never pushed back by later ones, so
-- what it holds was logged within that long (the windows' bound rests on it). The first
-- event of a log carries began=1: a follower whose position lies in an earlier log (expired
-- since) may have missed its last events, and ends (storage/feed.py).
-- A log that would pass EVENTS_MAX_BYTES begins again the same way (what it keeps of
-- delivered prompts is bounded in bytes, not only in time): its events are trimmed (the key,
-- and so the order of its IDs, stays), its bytes come off the windows, and the new event
-- carries began=1 and after=<the last ID trimmed>: a reader that stood there goes on, one
-- behind it gets a reset, never a silent gap.
-- Then announce the new event's ID on the shard channel named like the log's key (it hashes
-- to the same {ws} slot, so a cluster allows it here): the processes following the session
-- (storage/feed.py) read it then, instead of each holding a connection blocked in XREAD.
-- The announcement is only a hint: a follower that misses one still finds the event in the log.
-- An event costs what it carries: its ID, its field names ('kind', 'id', 'entry': 11 bytes)
-- and values. A log's first event costs the new log whole (MEMORY USAGE: Valkey gives a new
-- stream its first node at stream-node-max-bytes, 4 KiB by default, whatever the event), so
-- a log per session with one small event each is counted at what it holds, not a tenth (and
-- at least what it carries).
local EVENT_FIELD_BYTES = 11
local function emit(K, kind, id, raw)
  local record = redis.call('HGET', K[LOGBYTES], K[EVENTS])
  local began, held = string.match(record or '', '^(%d+):(%d+)$')
  began, held = tonumber(began), tonumber(held) or 0
  local size = EVENT_FIELD_BYTES + #kind + #id + #raw
  local fresh = redis.call('EXISTS', K[EVENTS]) == 0
  local after = nil
  if not fresh and held > 0 and held + size > EVENTS_MAX_BYTES then
    local last = redis.call('XREVRANGE', K[EVENTS], '+', '-', 'COUNT', 1)[1]
    after = last and last[1]
    redis.call('XTRIM', K[EVENTS], 'MAXLEN', 0)
    budget().unspent(K, held)
    fresh = true
  end
  local event_id
  if fresh then
    -- A log's first event: after the log it begins again after (if any), for its readers.
    local tail = {'began', '1'}
    if after then tail = {'began', '1', 'after', after} end
    event_id = redis.call('XADD', K[EVENTS], 'MAXLEN', EVENTS_MAXLEN, '*',
      'kind', kind, 'id', id, 'entry', raw, unpack(tail))
    redis.call('PEXPIRE', K[EVENTS], EVENTS_TTL_MS)
    for _, v in ipairs(tail) do size = size + #v end
    size = math.max(size + #event_id, redis.call('MEMORY', 'USAGE', K[EVENTS]))
    began, held = window(EVENTS_TTL_MS), 0
  else
    event_id = redis.call('XADD', K[EVENTS], 'MAXLEN', EVENTS_MAXLEN, '*',
      'kind', kind, 'id', id, 'entry', raw)
    size = size + #event_id
    -- A log from before these records: counted from now, as begun now.
    began = began or window(EVENTS_TTL_MS)
  end
  redis.call('HSET', K[LOGBYTES], K[EVENTS], string.format('%d:%d', began, held + size))
  spent(K, '', EVENTS_TTL_MS, size)
  redis.call('SPUBLISH', K[EVENTS], event_id)
end

-- Log a turn's end (turn_end.lua; a claim whose turn had ended already): the entry it
-- delivered, the turn's ID, how long it lasted (s) and why it ended.
local function emit_turn_ended(K, entry, turn, seconds, why)
  local ended = {turn = turn, entry = entry, seconds = seconds, why = why}
  emit(K, 'turn_ended', entry, cjson.encode(ended))
end

-- emit() for an entry whose new state is raw: the kind is its status. Returns the entry
-- decoded (nil if it does not decode).
local function emit_state(K, raw)
  local e = decode(raw)
  if e then emit(K, e.status, e.id, raw) end
  return e
end

-- The session's ready score (ms), or nil when it needs no worker.
local function ready_of(K, ses)
  local score = redis.call('ZSCORE', K[READY], ses)
  if score then return tonumber(score) end
  return nil
end

-- After a holder let its lock go: the session's ready score if that moved earlier than
-- `before` (the run loops' due mark may be later: the caller must mark), else ''. Only this
-- session's score changed, so only it can have moved the workspace's work earlier.
local function lowered(K, ses, before)
  local after = ready_of(K, ses)
  if after and (before == nil or after < before) then return string.format('%d', after) end
  return ''
end

local function take_lock(K, ses, lockval, lease, now)
  redis.call('SET', K[L], lockval, 'PX', lease)
  -- If this holder dies, the session is due again when its lease lapses.
  redis.call('ZADD', K[READY], now + lease, ses)
end

-- The workspace quota's count (K[COUNT], a HASH): the session now holds n entries (queue
-- plus staging). The total moves by the difference from what the HASH held for the session,
-- so total = the sum of the session fields always, and a session whose field was off (data
-- from before the count, a stage that failed between its two writes) is exact again after
-- its next script. A session without entries keeps no field, a workspace without any no key.
local function count(K, ses, n)
  local total = counted(K, ses, n, COUNT_TOTAL)
  if total and total <= 0 then redis.call('DEL', K[COUNT]) end
end

-- count() from the lists' lengths, for a script that removed entries and keeps the other
-- indexes by other means (complete.lua, when its next step re-leases the session).
local function recount(K, ses)
  count(K, ses, redis.call('LLEN', K[Q]) + redis.call('LLEN', K[D]))
end

--[[ The tally: what the overview shows, kept beside the count (K[COUNT]) by the same scripts,
  so that no page and no count reads an entry (docs/design.md, "The overview"):
    <ses>|tally  the session's entries in each status (queue plus staging), in STATUSES' order,
                 then the earliest lastAttemptAt (ms) of its staged entries ('' when none):
                 "p,d,v,e,k,sent", one field so that a script reads and writes it once; no
                 field for a session that holds nothing
    :<status>    the workspace's entries in that status: the sum of the session fields
  and K[OLDEST], session -> acceptedAt (ms) of its oldest pending entry: the first pending one
  in its queue (accept appends; restore and recovery put an entry back in its place; retry,
  unpark and the sweeps change an entry where it stands), so the first in line. Staging holds
  only delivering copies, never a pending one.
  refresh() reads both lists whole already, and derives it. The three scripts that do not
  (accept, stage, complete) move it by what they changed, in O(1) (stage and a complete that
  removed a pending entry also read the queue up to its first pending entry), once they have
  checked that the session's stored counts add up to its entries. When they do not (entries
  from before the tally, or drift), they derive it from the lists instead: once, after which
  they add up again.
  A tally in Lua is an array: t[i] the entries in STATUSES[i], t.sent the send start (ms or
  nil), t.oldest (derived ones only). Plain arrays and few tables: these run on the hot path. ]]

-- Set when this script's change moved the workspace's oldest pending entry (set_oldest), so
-- that it is written into the series' ring (series_moved), and cleared when the ring has it.
local oldest_moved = false

-- The tally's functions, made on a script's first call: most scripts never move it, and every
-- closure the prelude makes costs every call of every script (a few us for these).
local tally_fns
local function tally()
  if tally_fns then return tally_fns end
  local AT, NS = {}, #STATUSES
  for i, s in ipairs(STATUSES) do AT[s] = i end
  local TALLY_FORM = '^' .. string.rep('(%d+),', NS) .. '(%d*)$'

  local function tally_field(ses)
    return ses .. COUNT_SEP .. 'tally'
  end

  -- The status of an entry string: in O(1) for the form Python writes (status last, no blanks),
  -- else by decoding it. Exact for valid JSON: an unescaped quote cannot stand inside a string,
  -- so ',"status":"x"}' at the very end is the top-level object's last member (and, for a key
  -- given twice, the one cjson keeps).
  local function status_of(raw)
    local s = string.match(string.sub(raw, -32), '[,{]"status":"(%a+)"}$')
    if s then return s end
    local e = decode(raw)
    return e and e.status
  end

  local function new_tally()
    local t = {}
    for i = 1, NS do t[i] = 0 end
    return t
  end

  -- The session's tally as stored (a new one if none), and the sum of its counts.
  local function stored_tally(K, ses)
    local got = {string.match(redis.call('HGET', K[COUNT], tally_field(ses)) or '', TALLY_FORM)}
    if #got == 0 then return new_tally(), 0 end
    local sum = 0
    for i = 1, NS do
      got[i] = tonumber(got[i])
      sum = sum + got[i]
    end
    got.sent = tonumber(got[NS + 1])
    got[NS + 1] = nil
    return got, sum
  end

  -- Move the session's tally t by delta entries in one status (never below 0), and the
  -- workspace's total with it: a total is always the sum of its session fields. (Totals at 0
  -- stay, a few fields a workspace; the count's key goes when the workspace empties.)
  local function move(K, t, status, delta)
    local i = AT[status]
    if not i then return end
    local n = math.max(0, t[i] + delta)
    if n == t[i] then return end
    redis.call('HINCRBY', K[COUNT], ':' .. status, n - t[i])
    t[i] = n
  end

  -- Write the session's tally field; none when it counts nothing.
  local function save_tally(K, ses, t)
    local any = t.sent ~= nil
    for i = 1, NS do any = any or t[i] > 0 end
    if not any then return redis.call('HDEL', K[COUNT], tally_field(ses)) end
    local sent = t.sent and string.format('%d', t.sent) or ''
    redis.call('HSET', K[COUNT], tally_field(ses), table.concat(t, ',', 1, NS) .. ',' .. sent)
  end

  local function put_oldest(K, ses, ms)
    if ms then
      redis.call('ZADD', K[OLDEST], ms, ses)
    else
      redis.call('ZREM', K[OLDEST], ses)
    end
  end

  -- put_oldest, noting when the workspace's oldest (the index's first) moves: the session was
  -- first and its oldest changed, or its new oldest is earlier than the first. (A session tied
  -- with the first may note a move that changed nothing: one more write of the same value.)
  local function set_oldest(K, ses, ms)
    local first = redis.call('ZRANGE', K[OLDEST], 0, 0, 'WITHSCORES')
    local at = tonumber(first[2])
    if (first[1] == ses and at ~= ms) or (ms and (at == nil or ms < at)) then
      oldest_moved = true
    end
    put_oldest(K, ses, ms)
  end

  -- When a staged (decoded) entry was handed to the agent, ms; nil if it does not say.
  local function sent_of(e)
    if type(e.lastAttemptAt) == 'string' and e.lastAttemptAt ~= '' then
      return parse_ms(e.lastAttemptAt)
    end
    return nil
  end

  -- acceptedAt (ms) of the queue's first pending entry, or nil: reads the queue up to it only.
  local function first_pending(queue)
    local at
    walk(queue, function(_, e, _)
      if e and e.status == 'pending' then at = parse_ms(e.acceptedAt) end
      return at ~= nil
    end)
    return at
  end

  -- Read the session's lists whole, decoding each entry: its tally (with oldest), its delivery
  -- head's due time (nil when nothing blocks) and whether it holds an error entry.
  local function derive(K)
    local t, due, has_error = new_tally(), nil, false
    t.bytes = 0
    for _, raw in ipairs(redis.call('LRANGE', K[D], 0, -1)) do
      t.bytes = t.bytes + entry_bytes(raw)
      local e = decode(raw)
      if e then
        if AT[e.status] then t[AT[e.status]] = t[AT[e.status]] + 1 end
        local ms = sent_of(e)
        if ms and (t.sent == nil or ms < t.sent) then t.sent = ms end
      end
    end
    for _, raw in ipairs(redis.call('LRANGE', K[Q], 0, -1)) do
      t.bytes = t.bytes + entry_bytes(raw)
      local e = decode(raw)
      if e then
        if AT[e.status] then t[AT[e.status]] = t[AT[e.status]] + 1 end
        if e.status == 'error' then
          has_error = true
        elseif due == nil and blocking(e.status) then
          due = parse_ms(e.nextAttemptAt)
        end
        if t.oldest == nil and e.status == 'pending' then t.oldest = parse_ms(e.acceptedAt) end
      end
    end
    return t, due, has_error
  end

  -- Store a tally derived from the lists, in place of what was stored.
  local function store_tally(K, ses, t)
    local stored = stored_tally(K, ses)
    for i, s in ipairs(STATUSES) do move(K, stored, s, t[i] - stored[i]) end
    stored.sent = t.sent
    save_tally(K, ses, stored)
    set_oldest(K, ses, t.oldest)
  end

  local function retally(K, ses)
    store_tally(K, ses, (derive(K)))
  end

  -- For a script that moves the tally by its own change (accept, stage, complete): the session's
  -- stored tally if it adds up to n, its entries before the change; nil if not, and then the
  -- script derives the tally after its change (retally) instead of moving it.
  local function tally_before(K, ses, n)
    local t, sum = stored_tally(K, ses)
    if sum == n then return t end
    return nil
  end

  -- accept.lua pushed a pending entry accepted at `at` (ms) onto a session of n entries.
  local function tally_pushed(K, ses, n, at)
    local t = tally_before(K, ses, n)
    if not t then return retally(K, ses) end
    -- No pending entry before it: the new one is the first in line. (accept.lua records the
    -- series after it anyway: nothing to note, no read more per accept.)
    if t[AT.pending] == 0 then put_oldest(K, ses, at) end
    move(K, t, 'pending', 1)
    save_tally(K, ses, t)
  end

  -- stage.lua moved a queue entry of status `old` into staging, which was empty (t is nil
  -- otherwise), as the entry e (decoded; delivering).
  local function tally_staged(K, ses, t, old, e)
    if not (t and e) then return retally(K, ses) end
    move(K, t, old, -1)
    move(K, t, e.status, 1)
    t.sent = sent_of(e)
    save_tally(K, ses, t)
    if old == 'pending' then set_oldest(K, ses, first_pending(K[Q])) end
  end

  -- complete.lua removed copies of one entry, of these statuses, from staging (from_staging)
  -- and the queue; `left` entries are still staged.
  local function tally_removed(K, ses, t, statuses, from_staging, left)
    -- Staging that still holds entries (only ever after a failure) is derived again.
    if not t or left > 0 then return retally(K, ses) end
    local pending = false
    for _, s in ipairs(statuses) do
      move(K, t, s, -1)
      pending = pending or s == 'pending'
    end
    if from_staging then t.sent = nil end
    save_tally(K, ses, t)
    if pending then set_oldest(K, ses, first_pending(K[Q])) end
  end

  tally_fns = {
    NS = NS, status_of = status_of, stored = stored_tally, derive = derive,
    store = store_tally, before = tally_before, pushed = tally_pushed,
    staged = tally_staged, removed = tally_removed,
  }
  return tally_fns
end

--[[ The series: the workspace's prompts accepted, delivered and failed per minute, and its
  oldest pending entry as it stood, for the queue page's charts (docs/design.md, "The series").
  outboxseries:{ws}, named from K[COUNT] (the same {ws} slot), a HASH ring of SERIES_SLOTS
  fields: minute % SERIES_SLOTS -> "minute,accepted,delivered,failed,oldest" (oldest: the
  workspace's first pending acceptedAt, ms, after this change; '' none pending). A field of an
  older minute is that slot's last lap: it is started again, so the key never holds more than
  SERIES_SLOTS fields, and it expires SERIES_SLOTS minutes after the last minute that began one.
  Called by accept (col 1), complete (2, a claimed send) and restore / replace (3, a move into
  error): HGET, ZRANGE of one member, HSET (and PEXPIRE once a minute). Every other script
  whose change moved the workspace's oldest (set_oldest noted it: a stage, retry, dismiss,
  park, unpark, recovery...) records that alone, counting nothing (series_moved), so a quiet
  minute's oldest is the backlog as it stood, not as of the last counted flow. ]]
local SERIES_SLOTS = 120
-- col nil: count nothing, record the oldest only.
local function series(K, now, col, n)
  local key = 'outboxseries:' .. string.sub(K[COUNT], 13)
  local minute = math.floor(now / 60000)
  local field = string.format('%d', minute % SERIES_SLOTS)
  local at, a, d, f = string.match(redis.call('HGET', key, field) or '',
    '^(%d+),(%d+),(%d+),(%d+),')
  local c, fresh = {0, 0, 0}, tonumber(at) ~= minute
  if not fresh then c = {tonumber(a), tonumber(d), tonumber(f)} end
  if col then c[col] = c[col] + n end
  local first = redis.call('ZRANGE', K[OLDEST], 0, 0, 'WITHSCORES')[2] or ''
  redis.call('HSET', key, field,
    string.format('%d,%d,%d,%d,', minute, c[1], c[2], c[3]) .. first)
  if fresh then redis.call('PEXPIRE', key, SERIES_SLOTS * 60000) end
  oldest_moved = false
end

-- The series for a script that counts no flow: the workspace's oldest, if its change moved it.
local function series_moved(K, now)
  if oldest_moved then series(K, now) end
end

-- The sessions and ready indexes, and the count, for one session, given its delivery head's
-- due time (nil when nothing blocks).
local function index(K, ses, now, due)
  local staged = redis.call('LLEN', K[D])
  local n = redis.call('LLEN', K[Q]) + staged
  if n == 0 then
    redis.call('SREM', K[SESSIONS], ses)
  else
    redis.call('SADD', K[SESSIONS], ses)
  end
  count(K, ses, n)
  local pttl = redis.call('PTTL', K[L])
  if pttl ~= -2 then
    -- Whoever holds the lock owns the session until it lapses; a turn is due at its check.
    if pttl < 0 then pttl = 1000 end
    local score = now + pttl
    local check = turn_check_ms(redis.call('GET', K[L]))
    if check and check < score then score = check end
    redis.call('ZADD', K[READY], score, ses)
  elseif staged > 0 then
    -- Staging without a holder: a worker died mid-delivery; recover it now.
    redis.call('ZADD', K[READY], now, ses)
  elseif due ~= nil then
    redis.call('ZADD', K[READY], due, ses)
  else
    redis.call('ZREM', K[READY], ses)
  end
end

-- Recompute the workspace indexes for one session from its lists: the only place they are
-- derived, called at the end of every script that changes a session. Reads the whole queue
-- (the errors index needs every entry) and staging (0 or 1 entry but after a failure): for
-- scripts that may add or remove an error entry. The tally is derived from the same read,
-- and the session's queued bytes (sized).
local function refresh(K, ses, now)
  local T = tally()
  local t, due, has_error = T.derive(K)
  T.store(K, ses, t)
  sized(K, ses, t.bytes)
  if has_error then
    redis.call('SADD', K[ERRORS], ses)
  else
    redis.call('SREM', K[ERRORS], ses)
  end
  index(K, ses, now, due)
end

-- refresh() for a script that added and removed no error entry (accept, acquire, release, a
-- complete that claimed a non-error entry): the errors index is still exact, so only the
-- queue's head is read, and the cost does not grow with the queue.
local function refresh_head(K, ses, now)
  local _, due = find_head(K[Q])
  index(K, ses, now, due)
end

-- index() for an entry just pushed at the queue's tail, due at `due` were it the delivery
-- head, in O(1) (accept.lua). n: the session's entries before the push. Every script leaves
-- the indexes exact, so a session that held entries is in SESSIONS already, and one with a
-- ready score (a holder's lease, staging to recover, or a blocking head) keeps it: the new
-- entry waits behind. One without has no holder, nothing staged and no blocking entry, so the
-- new entry is its delivery head. Returns true when that made the session ready.
local function index_pushed(K, ses, n, due)
  if n == 0 then redis.call('SADD', K[SESSIONS], ses) end
  count(K, ses, n + 1)
  return redis.call('ZADD', K[READY], 'NX', due, ses) == 1
end

-- What the session needs now, for a caller that holds its lock or found it free (acquire.lua,
-- and complete.lua when the completer asks for its next step in the same call): the reply
-- acquire.lua documents, without 'busy'. cur: the lock's value as read (nil when free).
local function next_step(K, ses, lockval, lease, now, cur)
  local staged = redis.call('LRANGE', K[D], 0, -1)
  if #staged > 0 then
    take_lock(K, ses, lockval, lease, now)
    table.insert(staged, 1, 'staged')
    return staged
  end
  local raw, due = find_head(K[Q])
  if raw and due <= now then
    take_lock(K, ses, lockval, lease, now)
    return {'head', raw}
  end
  local before = ready_of(K, ses)
  if cur then redis.call('DEL', K[L]) end
  refresh_head(K, ses, now)
  if raw then return {'wait', lowered(K, ses, before)} end
  return {'idle', lowered(K, ses, before)}
end

-- The due index (storage/dueindex.py): the workspace ws must be visited by a run loop no later
-- than `by` (ms). MK: the bucket's due index, registry and pending writers. kind: 'before' a
-- transition, 'after' it (closing that 'before'), or 'alone' (a change already in place,
-- or made in this same script). A mark only ever lowers (ZADD LT); 'after' and 'alone' also
-- publish the workspace on the bucket's wake channel, so idle loops look at once.
local function mark_due(MK, ws, by, kind, wake)
  redis.call('ZADD', MK[1], 'LT', by, ws)
  -- The generation: the server's clock in microseconds, strictly increasing per workspace, so
  -- a run loop can tell "no writer since I read it".
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local prev = tonumber(redis.call('HGET', MK[2], ws) or '0')
  if now_us <= prev then now_us = prev + 1 end
  redis.call('HSET', MK[2], ws, string.format('%d', now_us))
  local raw = redis.call('HGET', MK[3], ws)
  local n = raw and tonumber(string.match(raw, '^(%d+):')) or 0
  if kind == 'before' then
    redis.call('HSET', MK[3], ws, string.format('%d:%d', n + 1, now_us))
    return
  end
  if kind == 'after' and raw then
    if n <= 1 then
      redis.call('HDEL', MK[3], ws)
    else
      redis.call('HSET', MK[3], ws, string.format('%d:%s', n - 1, string.match(raw, ':(%d+)$')))
    end
  end
  redis.call('SPUBLISH', wake, ws)
end
