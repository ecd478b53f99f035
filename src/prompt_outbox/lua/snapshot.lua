-- Snapshot (read only): the session's queue, staging, lock value and lock PTTL in one read.
return {
  redis.call('LRANGE', KEYS[Q], 0, -1),
  redis.call('LRANGE', KEYS[D], 0, -1),
  redis.call('GET', KEYS[L]) or '',
  redis.call('PTTL', KEYS[L]),
}
