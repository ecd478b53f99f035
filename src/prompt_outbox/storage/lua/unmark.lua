--[[
  Unmark: a run loop visited the workspace and saw its work; move the mark to when the
  workspace next needs a visit, or drop it, unless a writer marked it since the loop read it.

  The loop read the mark and the generation (ARGV[2], ARGV[3]) BEFORE it read the workspace,
  so an unchanged generation means no writer marked since. A writer that marked BEFORE its
  transition and not yet AFTER it (the pending count, see mark.lua) may have a transition the
  loop did not see: while the latest such mark is younger than ARGV[5], the mark stays no
  later than that mark plus ARGV[5]. If that writer dies before its AFTER mark, its work waits
  at most that long; an older pending count is a dead writer's, and is cleared.

  Input:
    KEYS[1]    the bucket's due index
    KEYS[2]    the bucket's registry
    KEYS[3]    the bucket's pending writers
    ARGV[1]    workspace ID
    ARGV[2]    the mark's score as the loop read it
    ARGV[3]    the generation as the loop read it ('' if none)
    ARGV[4]    the next visit, ms ('' when the workspace has no timed work)
    ARGV[5]    grace, ms: how long a writer's transition may trail its BEFORE mark

  Output:
    {'ok'}         moved or dropped
    {'changed'}    a writer marked since the read (or another loop moved it); left alone

  Events: none.
]]
local ws, seen_score, seen_gen, nxt = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local grace_ms = tonumber(ARGV[5])
local score = redis.call('ZSCORE', KEYS[1], ws)
if not score or tonumber(score) ~= seen_score then return {'changed'} end
local gen = redis.call('HGET', KEYS[2], ws) or ''
if gen ~= seen_gen then return {'changed'} end
local pending = redis.call('HGET', KEYS[3], ws)
if pending then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local settle_ms = math.floor(tonumber(string.match(pending, ':(%d+)$')) / 1000) + grace_ms
  if settle_ms > now_ms then
    if nxt == '' or tonumber(nxt) > settle_ms then nxt = string.format('%d', settle_ms) end
  else
    redis.call('HDEL', KEYS[3], ws)
  end
end
if nxt == '' then
  redis.call('ZREM', KEYS[1], ws)
else
  redis.call('ZADD', KEYS[1], tonumber(nxt), ws)
end
return {'ok'}
