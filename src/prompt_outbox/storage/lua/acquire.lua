--[[
  Acquire: take the session lock (re-entrant for its holder) and say what is to be done.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    session ID
    ARGV[2]    lock value (the caller's token)
    ARGV[3]    lease, ms
    ARGV[4]    now, ms

  Output:
    {'busy'}               another holder; the ready score moves to its lease expiry (a
                           turn's: to its check time)
    {'turn', v}            the session is in turn (core/turns.py) and its check is due: this
                           caller asks the agent. v: the turn's value, its check moved a lease
                           ahead so other callers leave it to this one meanwhile. No lock taken
    {'staged', e1, ...}    staging is not empty (a dead worker's entries, to recover first);
                           the lock is now held
    {'head', e}            the first blocking entry is due; the lock is now held
    {'wait', m}            the head is not due yet; the lock is released
    {'idle', m}            nothing blocks; the lock is released
                           m: as release.lua's (this is how a holder's drain lets go)

  Events: none.
]]
local ses, lockval, lease, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local other, cur = held_by_other(KEYS, lockval)
if other then
  local check = turn_check_ms(cur)
  if check and check <= now then
    cur = turn_checked(cur, now + lease)
    redis.call('SET', KEYS[L], cur, 'KEEPTTL')
    refresh_head(KEYS, ses, now)
    return {'turn', cur}
  end
  refresh_head(KEYS, ses, now)
  return {'busy'}
end
return next_step(KEYS, ses, lockval, lease, now, cur)
