-- Recover one session: staged entries re-enter at the delivery head as verifying, in order
-- (inserted last-first, each in front of the one after it).
-- Runs under the caller's lock and only against the exact staging it read (else -2); an entry
-- whose ID is already in the queue is replaced in place, never added twice. Then staging goes.
-- ARGV: ses, lockval, now_ms, n, staged_1..staged_n, new_1..new_n.
local ses, lockval, now, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('GET', KEYS[L]) ~= lockval then return -1 end
local cur = redis.call('LRANGE', KEYS[D], 0, -1)
if #cur ~= n then return -2 end
for i = 1, n do
  if cur[i] ~= ARGV[4 + i] then return -2 end
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
return n
