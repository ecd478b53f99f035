--[[
  Repair: re-derive one session's workspace indexes from its lists (the slow safety net).

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    now, ms

  Output:
    {'ok'}

  Events: none. Series: the oldest pending, if the repair moved it (lib.lua series_moved).
]]
refresh(KEYS, ARGV[1], tonumber(ARGV[2]))
series_moved(KEYS, tonumber(ARGV[2]))
return {'ok'}
