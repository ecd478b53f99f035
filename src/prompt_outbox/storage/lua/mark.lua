--[[
  Mark: the workspace must be visited by a run loop no later than ARGV[2] (the due index).
  A writer whose transition may make work due sooner marks BEFORE it (so a crash after it
  leaves a mark, never missing work) and AFTER it, with the wake-up; a holder letting a lock
  go marks only after (ALONE). A mark only ever lowers (ZADD LT). A run loop raises or
  removes it (unmark.lua) only against the generation below, and never while a BEFORE mark
  younger than its grace still waits for its AFTER (the pending count).

  Input:
    KEYS[1]    the bucket's due index (outboxdue:{outbox-b<N>})
    KEYS[2]    the bucket's registry (outboxregistry:{outbox-b<N>}): workspace -> generation
    KEYS[3]    the bucket's pending writers (outboxpending:{outbox-b<N>}): workspace -> "n:us"
    ARGV[1]    workspace ID
    ARGV[2]    visit by, ms
    ARGV[3]    'before' | 'after' (closes a 'before') | 'alone' (a change already in place)
    ARGV[4]    the bucket's wake channel (a shard channel in the bucket's slot)

  Output:
    {'ok'}

  Events: none (a wake-up message, SPUBLISH, for 'after' and 'alone').
]]
local ws, kind = ARGV[1], ARGV[3]
redis.call('ZADD', KEYS[1], 'LT', tonumber(ARGV[2]), ws)
-- The generation: the server's clock in microseconds, strictly increasing per workspace, so a
-- run loop can tell "no writer since I read it".
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prev = tonumber(redis.call('HGET', KEYS[2], ws) or '0')
if now_us <= prev then now_us = prev + 1 end
redis.call('HSET', KEYS[2], ws, string.format('%d', now_us))
local raw = redis.call('HGET', KEYS[3], ws)
local n = raw and tonumber(string.match(raw, '^(%d+):')) or 0
if kind == 'before' then
  redis.call('HSET', KEYS[3], ws, string.format('%d:%d', n + 1, now_us))
  return {'ok'}
end
if kind == 'after' and raw then
  if n <= 1 then
    redis.call('HDEL', KEYS[3], ws)
  else
    redis.call('HSET', KEYS[3], ws, string.format('%d:%s', n - 1, string.match(raw, ':(%d+)$')))
  end
end
redis.call('SPUBLISH', ARGV[4], ws)
return {'ok'}
