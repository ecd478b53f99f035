--[[
  Confirm an accept before waiting for it to be durable: write the dedupe marker again, same
  value, same expiry. It changes nothing, but it is a write of THIS connection that lands in
  the AOF and the replication stream after the accept it names, so the WAITAOF sent next on
  the connection waits for that accept too, also when another connection wrote it (a
  duplicate, or an accept confirmed apart from its pipeline). Without a write, WAITAOF on a
  connection that wrote nothing answers at once.

  Input:
    KEYS[1]    dedupe marker outboxdedupe:{ws}:{ses}:<cmid>

  Output:
    {'ok', id}  the marker names entry id; written again
    {'gone'}    no marker: the accept is not on this server (lost in a failover), or expired

  Events: none.
]]
local id = redis.call('GET', KEYS[1])
if not id then return {'gone'} end
redis.call('SET', KEYS[1], id, 'KEEPTTL')
return {'ok', id}
