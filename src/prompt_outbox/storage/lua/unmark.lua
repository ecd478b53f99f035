--[[
  Unmark: a run loop visited the workspace and saw its work; move the mark to when the
  workspace next needs a visit, or drop it, unless a writer marked it since the loop read it.

  A writer marks before its transition and again after. The loop read the mark and the
  generation (ARGV[2], ARGV[3]) BEFORE it read the workspace, so an unchanged generation means
  no writer marked since. If the last mark came BEFORE a transition (an odd generation, see
  mark.lua) less than ARGV[5] ago, the loop may not have seen that transition yet: the mark
  stays no later than the generation plus ARGV[5]; if that writer dies before its second mark,
  its work waits at most that long.

  Input:
    KEYS[1]    the bucket's due index
    KEYS[2]    the bucket's registry
    ARGV[1]    workspace ID
    ARGV[2]    the mark's score as the loop read it
    ARGV[3]    the generation as the loop read it ('' if none)
    ARGV[4]    the next visit, ms ('' when the workspace has no timed work)
    ARGV[5]    grace, ms: how long a writer's transition may trail its first mark

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
if gen ~= '' and tonumber(gen) % 2 == 1 then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local settle_ms = math.floor(tonumber(gen) / 1000) + grace_ms
  if settle_ms > now_ms and (nxt == '' or tonumber(nxt) > settle_ms) then nxt = settle_ms end
end
if nxt == '' then
  redis.call('ZREM', KEYS[1], ws)
else
  redis.call('ZADD', KEYS[1], tonumber(nxt), ws)
end
return {'ok'}
