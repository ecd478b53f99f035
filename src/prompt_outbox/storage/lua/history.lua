--[[
  History (read only): the newest events of a session's log, newest first, each without the
  entry it carries: a history answer shows which prompts were sent and their turns, and an
  event carries its whole entry (up to some hundreds of KB). Only a turn's value and a turn's
  end (a few hundred bytes) come back whole. Read a few events at a time, so that what the
  script holds stays small whatever the events carry.

  Input:
    KEYS[1]    the session's event log
    ARGV[1]    how many of its newest events to look at

  Output:
    {'ok', id_1, kind_1, entry id_1, body_1, id_2, ...}   body: '' but for 'turn' and
                                                          'turn_ended' events

  Events: none.
]]
local left, out, before = tonumber(ARGV[1]), {'ok'}, '+'
while left > 0 do
  local rows = redis.call('XREVRANGE', KEYS[1], before, '-', 'COUNT', math.min(left, 8))
  for _, row in ipairs(rows) do
    local f = {}
    for i = 1, #row[2], 2 do f[row[2][i]] = row[2][i + 1] end
    local kind = f.kind or ''
    local body = ''
    if kind == 'turn' or kind == 'turn_ended' then body = f.entry or '' end
    table.insert(out, row[1])
    table.insert(out, kind)
    table.insert(out, f.id or '')
    table.insert(out, body)
  end
  if #rows < math.min(left, 8) then break end
  left = left - #rows
  before = '(' .. rows[#rows][1]
end
return out
