--[[
  Recover one session: staged entries re-enter at the delivery head as verifying, in order
  (inserted last-first, each in front of the one after it). Runs under the caller's lock and
  only against the exact staging it read; an entry whose ID is already in the queue is
  replaced in place, never added twice. Then staging goes.

  Input:
    KEYS[1..10]    session keys
    ARGV[1]        session ID
    ARGV[2]        lock value
    ARGV[3]        now, ms
    ARGV[4]        n, the number of staged entries read
    ARGV[5..4+n]   the staged entries, as read
    ARGV[5+n..4+2n] their new states (verifying), same order

  Output:
    {'ok', n}      requeued n entries
    {'lost'}       the caller no longer holds the lock; nothing written
    {'changed'}    staging is not what the caller read; nothing written

  Events: verifying, once per entry. Series: the oldest pending, if this moved it (lib.lua
  series_moved).
]]
local ses, lockval, now, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if not holds(KEYS, lockval) then return {'lost'} end
local cur = redis.call('LRANGE', KEYS[D], 0, -1)
if #cur ~= n then return {'changed'} end
for i = 1, n do
  if cur[i] ~= ARGV[4 + i] then return {'changed'} end
end
for i = n, 1, -1 do
  local new = ARGV[4 + n + i]
  local idx = index_of_id(KEYS[Q], cjson.decode(new).id)
  if idx then
    redis.call('LSET', KEYS[Q], idx, new)
  else
    insert_in_place(KEYS[Q], new)
  end
end
for i = 1, n do emit_state(KEYS, ARGV[4 + n + i]) end
redis.call('DEL', KEYS[D])
refresh(KEYS, ses, now)
series_moved(KEYS, now)
return {'ok', n}
