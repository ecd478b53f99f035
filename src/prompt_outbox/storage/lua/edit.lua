--[[
  Edit before dispatch: swap a pending or error entry's string for one with a new text or
  model (the caller built it: same id, status and attempts), found by its exact old string as
  replace.lua finds one, and refused while anyone holds the session (a delivery in flight may
  be sending it). Its place, status and the indexes stay: text and model decide nothing about
  when, or whether, it is due. The dedupe marker's fingerprint stays the accepted payload's,
  so the client's retry of the original POST is still a duplicate. An edit logs the whole
  entry again: refused, as an accept is, when it would take the workspace past its byte
  budget.

  Input:
    KEYS[1..10] session keys
    ARGV[1]    the entry's JSON as the caller read it
    ARGV[2]    its new JSON
    ARGV[3]    entry ID
    ARGV[4]    the workspace's byte budget (as accept.lua's ARGV[12])
    ARGV[5]    session ID

  Output:
    {'ok'}       swapped
    {'busy'}     a holder has the session; nothing written
    {'bytes_full', used, queued, logs, markers, ms}  as accept.lua's; nothing written
    {'changed'}  the queue holds no such string any more (sent, retried, edited meanwhile):
                 read again; nothing written

  Events: edited.
]]
if held_by_other(KEYS, '') then return {'busy'} end
local over = budget().over(KEYS, tonumber(ARGV[4]), #ARGV[2])
if over then
  table.insert(over, 1, 'bytes_full')
  return over
end
local idx = redis.call('LPOS', KEYS[Q], ARGV[1])
if not idx then return {'changed'} end
redis.call('LSET', KEYS[Q], idx, ARGV[2])
emit(KEYS, 'edited', ARGV[3], ARGV[2])
resized(KEYS, ARGV[5], #ARGV[2] - #ARGV[1])
return {'ok'}
