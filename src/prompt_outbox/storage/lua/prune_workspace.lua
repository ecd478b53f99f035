--[[
  Prune: drop an idle workspace from the registry only if no accept touched it since the
  caller read its score (an accept re-adds the workspace BEFORE pushing, so this CAS is safe).

  Input:
    KEYS[1]    the workspace registry (outboxworkspaces)
    ARGV[1]    workspace ID
    ARGV[2]    its score, as the caller read it

  Output:
    {'ok'}       dropped
    {'changed'}  an accept touched it since (or it is gone); nothing written

  Events: none.
]]
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {'ok'}
end
return {'changed'}
