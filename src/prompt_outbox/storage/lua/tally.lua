--[[
  Tally (read only): what the overview shows of some of one workspace's sessions, in one
  consistent read of what the session scripts keep (lib.lua, "the tally"). No entry is read:
  the cost is a few small values a session, whatever its entries hold.

  Input:
    KEYS[1]        the workspace's count (HASH)
    KEYS[2]        its oldest-pending index (ZSET)
    KEYS[3..2+n]   the sessions' locks
    ARGV[1..n]     the session IDs, in the same order

  Output:
    {'ok', s_1, ..., s_n}, each s_i = {{entries in each status, in STATUSES' order},
      its oldest pending entry's acceptedAt ms ('' if none), its staged entry's send start
      ms ('' if none), its lock's value ('' if free), the lock's PTTL ms}

  Events: none.
]]
local T, K = tally(), {[COUNT] = KEYS[1], [OLDEST] = KEYS[2]}
local out = {'ok'}
for i, ses in ipairs(ARGV) do
  local t = T.stored(K, ses)
  local lock = KEYS[2 + i]
  table.insert(out, {
    {unpack(t, 1, T.NS)},
    redis.call('ZSCORE', K[OLDEST], ses) or '',
    t.sent and string.format('%d', t.sent) or '',
    redis.call('GET', lock) or '',
    redis.call('PTTL', lock),
  })
end
return out
