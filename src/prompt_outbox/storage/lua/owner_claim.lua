--[[
  Take the release of a lapsed owner's turns (core/turns.py) for a lease: a worker whose
  heartbeat in OWNERS lapsed holds turns nobody asks about; one other worker releases them.
  Its score moves a lease ahead, so the others leave it meanwhile, and if that worker dies
  before its release is done (and it is taken off), the score lapses again and another takes
  it: a release is never lost with the worker that took it.

  Input:
    KEYS[1]    OWNERS (ZSET worker ID -> ms its heartbeat lapses)
    ARGV[1]    the lapsed owner's ID
    ARGV[2]    now, ms
    ARGV[3]    the release's lease, ms

  Output:
    {'ok'}     taken: release its turns, then take it off (ZREM)
    {'busy'}   its score is not lapsed (alive again, or another worker took it); or it is gone

  Events: none.
]]
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) >= tonumber(ARGV[2]) then return {'busy'} end
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
return {'ok'}
