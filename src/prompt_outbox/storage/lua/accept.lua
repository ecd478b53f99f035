--[[
  Accept a prompt: dedupe first, then the cap, then push, and only THEN the dedupe marker (a
  marker without its entry would turn every client retry into a false duplicate).

  Input:
    KEYS[1..7] session keys (queue, staging, lock, ready, sessions, errors, events)
    KEYS[8]    dedupe marker outboxdedupe:{ws}:{ses}:<cmid>
    ARGV[1]    session ID
    ARGV[2]    entry JSON (status pending)
    ARGV[3]    entry ID
    ARGV[4]    cap: queued plus staged entries allowed
    ARGV[5]    dedupe TTL, ms
    ARGV[6]    now, ms

  Output:
    {'ok'}                 pushed, marker set
    {'duplicate', id}      the marker names the first accept's entry ID; nothing written
    {'full', n}            the session holds n >= cap entries; nothing written

  Events: accepted.
]]
local ses, entry, id = ARGV[1], ARGV[2], ARGV[3]
local cap, ttl, now = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local prev = redis.call('GET', KEYS[8])
if prev then return {'duplicate', prev} end
local n = redis.call('LLEN', KEYS[Q]) + redis.call('LLEN', KEYS[D])
if n >= cap then return {'full', n} end
redis.call('RPUSH', KEYS[Q], entry)
emit(KEYS, 'accepted', id, entry)
redis.call('SET', KEYS[8], id, 'PX', ttl)
refresh_head(KEYS, ses, now)
return {'ok'}
