--[[
  End a turn (core/turns.py): the agent said it ended (a watcher, the end route, a check), or
  a check let it go at its ceiling. The session's lock is deleted if it holds this turn, and
  the session's next entry is due at once.

  Input:
    KEYS[1..10] session keys
    KEYS[11]   the workspace's turns by owner (HASH session -> owner)
    KEYS[12]   the session's early end (STRING: a turn ID ended before it was held)
    KEYS[13]   the workspace's sessions in turn (ZSET, complete.lua's KEYS[16])
    ARGV[1]    session ID
    ARGV[2]    turn ID
    ARGV[3]    now, ms
    ARGV[4]    why it ended: 'ended', 'ceiling', 'unreachable'
    ARGV[5]    how long an early end is kept, ms (0: keep none, a check's own end)

  Output:
    {'ok', since, m, entry, tp}
                      ended; since: when the turn began (ms); m: as release.lua's (the
                      caller marks the due index if letting go moved the work earlier);
                      the turn's entry ID and trace context ('' none: core/turns.py)
    {'gone'}          the session holds no turn of that ID (unknown, over already, or
                      not held yet). Kept ARGV[5] ms in KEYS[12], for the claim that may
                      hold it, only while a send is in flight: an entry staged and the lock
                      a worker's token (not a turn). Anything else writes nothing

  Events: turn_ended (id: the turn's entry ID; entry: {"turn", "entry", "seconds", "why"}).
]]
local ses, turn, now, why = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local cur = redis.call('GET', KEYS[L])
local record = turn_record(cur)
if not record or record.turn ~= turn then
  -- The agent's end may outrun the claim that holds its turn: that claim holds none. Such a
  -- claim is only ever the end of a send in flight, so an end for a session with none (one
  -- that never existed, an idle one, one held in another turn) writes no key: a caller
  -- cannot leave a key for every session name it can think of.
  local sending = cur and not turn_check_ms(cur) and redis.call('LLEN', KEYS[D]) > 0
  if tonumber(ARGV[5]) > 0 and sending then
    redis.call('SET', KEYS[12], turn, 'PX', ARGV[5])
  end
  return {'gone'}
end
local before = ready_of(KEYS, ses)
redis.call('DEL', KEYS[L])
redis.call('HDEL', KEYS[11], ses)
redis.call('ZREM', KEYS[13], ses)
local since = tonumber(record.since) or now
emit_turn_ended(KEYS, tostring(record.entry), turn, math.max(0, now - since) / 1000, why)
refresh_head(KEYS, ses, now)
local tp = type(record.tp) == 'string' and record.tp or ''
return {'ok', string.format('%d', since), lowered(KEYS, ses, before), tostring(record.entry), tp}
