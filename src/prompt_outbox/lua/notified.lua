-- Notified: the OnDelivered call a claim owed has run; forget it. KEYS: notices, notices due.
-- ARGV: ses:entry_id. Returns 1 if the record was there.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
