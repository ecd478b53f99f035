--[[
  Entries (read only): a slice of a session's queue, for an operator action on many of its
  entries (retry or dismiss its errors, park or unpark it, a sweep): only the entries in the
  given statuses, from the one after the first ARGV[2] such entries, at most ARGV[1] bytes of
  them (always one, however large), and what the action must know of the session: whether a
  holder has it and whether it has staged entries. An action on a session costs a slice's
  bytes at a time, not the session's.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    the most bytes of entries to answer
    ARGV[2]    how many entries in these statuses to skip first (the slices before)
    ARGV[3..]  the statuses

  Output:
    {'ok', held, staged, more, raw_1, raw_2, ...}   held: 1 when the lock is held; staged:
                                                    the staging list's length; more: 1 when
                                                    the queue holds more such entries

  Events: none.
]]
local T = tally()
local wanted = {}
for i = 3, #ARGV do wanted[ARGV[i]] = true end
local budget, skip = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, bytes, more = {}, 0, 0
walk_raw(KEYS[Q], function(raw)
  if not wanted[T.status_of(raw)] then return false end
  if skip > 0 then
    skip = skip - 1
    return false
  end
  if #out > 0 and bytes + #raw > budget then
    more = 1
    return true
  end
  table.insert(out, raw)
  bytes = bytes + #raw
  return false
end)
local reply = {'ok', redis.call('EXISTS', KEYS[L]), redis.call('LLEN', KEYS[D]), more}
for _, raw in ipairs(out) do table.insert(reply, raw) end
return reply
