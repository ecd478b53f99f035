--[[
  Keep a turn after a check (core/turns.py): the agent says it runs, or could not say; or
  release the turns of an owner that stopped or died (owner '', check now). A
  compare-and-set of the whole value, so a check never revives a turn that ended meanwhile,
  nor overwrites an interrupt's abort asked since it read the turn.

  Input:
    KEYS[1..10] session keys
    KEYS[11]   the workspace's turns by owner (HASH session -> owner)
    ARGV[1]    session ID
    ARGV[2]    the turn's value as the checker got it (acquire.lua's 'turn' reply)
    ARGV[3]    its new value (the next check time, why)
    ARGV[4]    now, ms
    ARGV[5]    the new value's owner ('' none), recorded in KEYS[11]

  Output:
    {'ok'}     kept; the session is due again at the new check time
    {'gone'}   the value moved meanwhile (the turn ended, or was interrupted); nothing written

  Events: none.
]]
if redis.call('GET', KEYS[L]) ~= ARGV[2] then return {'gone'} end
redis.call('SET', KEYS[L], ARGV[3], 'KEEPTTL')
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[11], ARGV[1], ARGV[5])
else
  redis.call('HDEL', KEYS[11], ARGV[1])
end
refresh_head(KEYS, ARGV[1], tonumber(ARGV[4]))
return {'ok'}
