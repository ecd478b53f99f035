--[[
  Seed (SeedEntryForTest): append a raw entry to the queue, keeping the indexes and the log.
  For test harnesses; the caller has checked that the string decodes as an entry.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    entry JSON
    ARGV[3]    now, ms

  Output:
    {'ok'}

  Events: the entry's status. Series: the oldest pending, if it moved (lib.lua series_moved).
]]
redis.call('RPUSH', KEYS[Q], ARGV[2])
emit_state(KEYS, ARGV[2])
refresh(KEYS, ARGV[1], tonumber(ARGV[3]))
series_moved(KEYS, tonumber(ARGV[3]))
return {'ok'}
