-- Accept: dedupe first, then the cap, then push, and only THEN the dedupe marker
-- (a marker without its entry would turn every client retry into a false duplicate).
-- KEYS: session keys + [8] dedupe marker. ARGV: ses, entry, id, cap, dedupe_ttl_ms, now_ms.
local ses, entry, id = ARGV[1], ARGV[2], ARGV[3]
local cap, ttl, now = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local prev = redis.call('GET', KEYS[8])
if prev then return {'dup', prev} end
local n = redis.call('LLEN', KEYS[Q]) + redis.call('LLEN', KEYS[D])
if n >= cap then return {'full', n} end
redis.call('RPUSH', KEYS[Q], entry)
emit(KEYS, 'accepted', id, entry)
redis.call('SET', KEYS[8], id, 'PX', ttl)
refresh(KEYS, ses, now)
return {'ok'}
