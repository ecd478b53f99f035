--[[
  Entry (read only): the one entry of a session with this ID, for an operator action on it
  (retry, dismiss, edit), and what the action must know of the session: whether a holder has
  it (the action is refused) and whether it has staged entries (a dead worker's, recovered
  first). The lists are read up to the entry, and only it comes back: an action on one entry
  costs its bytes, not its session's.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    entry ID

  Output:
    {'ok', raw, where, held, staged}   raw: the entry ('' when neither list holds it);
                                       where: 'staging', 'queue' or ''; held: 1 when the
                                       lock is held; staged: the staging list's length

  Events: none.
]]
local id = ARGV[1]
-- Python writes every entry with its ID first: a prefix tells it without decoding the entry.
local prefix = '{"id":"' .. id .. '"'

local function found(list)
  local hit
  walk_raw(list, function(raw)
    if string.sub(raw, 1, #prefix) == prefix then
      hit = raw
    elseif string.sub(raw, 1, 7) ~= '{"id":"' then
      local e = decode(raw)
      if e and e.id == id then hit = raw end
    end
    return hit ~= nil
  end)
  return hit
end

local held = redis.call('EXISTS', KEYS[L])
local staged = redis.call('LLEN', KEYS[D])
local raw = found(KEYS[D])
if raw then return {'ok', raw, 'staging', held, staged} end
raw = found(KEYS[Q])
if raw then return {'ok', raw, 'queue', held, staged} end
return {'ok', '', '', held, staged}
