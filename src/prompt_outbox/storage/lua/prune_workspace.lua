--[[
  Prune: drop an idle workspace from its bucket (registry, due index, pending writers) only if
  no writer marked it since the caller read its generation (writers mark BEFORE pushing, so
  this CAS is safe: a racing accept changes the generation and the prune loses).

  Input:
    KEYS[1]    the bucket's due index
    KEYS[2]    the bucket's registry
    KEYS[3]    the bucket's pending writers
    ARGV[1]    workspace ID
    ARGV[2]    its generation, as the caller read it

  Output:
    {'ok'}       dropped
    {'changed'}  a writer marked it since (or it is gone); nothing written

  Events: none.
]]
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return {'ok'}
end
return {'changed'}
