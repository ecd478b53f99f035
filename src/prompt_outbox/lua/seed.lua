-- Seed (test harnesses only): append a raw entry, keeping the indexes. ARGV: ses, entry, now_ms.
redis.call('RPUSH', KEYS[Q], ARGV[2])
emit_state(KEYS, ARGV[2])
refresh(KEYS, ARGV[1], tonumber(ARGV[3]))
return 1
