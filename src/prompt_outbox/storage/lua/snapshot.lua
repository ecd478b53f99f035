--[[
  Snapshot (read only), in one consistent read: the session's queue, staging, lock value and
  lock PTTL; its event log's first and last IDs ('' when there is no log), length and count
  of events ever added (their difference is what the cap trimmed); the server time (ms); and
  the log's first event's 'after' field: the last ID of the log it began again after (lib.lua
  emit; '' for none).

  Input:
    KEYS[1..10] session keys

  Output:
    {'ok', queue, staging, lock value ('' if free), lock PTTL ms,
     {first event ID, last event ID, length, entries added, server time ms, first's after}}

  Events: none.
]]
local first, last, length, added, after = '', '', 0, 0, ''
if redis.call('EXISTS', KEYS[EVENTS]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[EVENTS])
  for i = 1, #info, 2 do
    local name, value = info[i], info[i + 1]
    if name == 'first-entry' and value then
      first = value[1]
      for j = 1, #value[2], 2 do
        if value[2][j] == 'after' then after = value[2][j + 1] end
      end
    elseif name == 'last-generated-id' then last = value
    elseif name == 'length' then length = value
    elseif name == 'entries-added' then added = value
    end
  end
end
local t = redis.call('TIME')
return {
  'ok',
  redis.call('LRANGE', KEYS[Q], 0, -1),
  redis.call('LRANGE', KEYS[D], 0, -1),
  redis.call('GET', KEYS[L]) or '',
  redis.call('PTTL', KEYS[L]),
  {first, last, length, added, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), after},
}
