-- Prune: drop an idle workspace from the registry only if no accept touched it since the
-- caller read its score (an accept re-adds the workspace BEFORE pushing, so this CAS is safe).
-- KEYS: [1] registry. ARGV: ws, score as read.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
