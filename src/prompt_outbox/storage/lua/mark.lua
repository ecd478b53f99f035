--[[
  Mark: the workspace must be visited by a run loop no later than ARGV[2] (the due index).
  Callers mark BEFORE a transition that may make work due sooner (so a crash after it leaves
  a mark, never missing work), and again AFTER it with the wake-up. A mark only ever lowers
  (ZADD LT); a run loop raises or removes it (unmark.lua) only against the generation below,
  whose parity says which kind of mark came last: odd BEFORE (the transition may not have
  landed yet), even AFTER.

  Input:
    KEYS[1]    the bucket's due index (outboxdue:{outbox-b<N>})
    KEYS[2]    the bucket's registry (outboxregistry:{outbox-b<N>}): workspace -> generation
    ARGV[1]    workspace ID
    ARGV[2]    visit by, ms
    ARGV[3]    '1' AFTER the transition (the work is there now: publish the workspace on the
               wake channel), '0' BEFORE it
    ARGV[4]    the bucket's wake channel (a shard channel in the bucket's slot)

  Output:
    {'ok'}

  Events: none (a wake-up message, SPUBLISH, when ARGV[3] is '1').
]]
local ws = ARGV[1]
redis.call('ZADD', KEYS[1], 'LT', tonumber(ARGV[2]), ws)
-- The generation: the server's clock in microseconds, strictly increasing per workspace, so a
-- run loop can tell "no writer since I read it" and how long ago the last one came.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local prev = tonumber(redis.call('HGET', KEYS[2], ws) or '0')
if now_us <= prev then now_us = prev + 1 end
local after = ARGV[3] == '1'
if (now_us % 2 == 0) ~= after then now_us = now_us + 1 end
redis.call('HSET', KEYS[2], ws, string.format('%d', now_us))
if after then redis.call('SPUBLISH', ARGV[4], ws) end
return {'ok'}
