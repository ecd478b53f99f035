--[[
  A transition and its due mark in one script, for a standalone server (on a cluster the
  marks live in other slots: there the caller marks before and after, in calls of their own).
  storage/scripts.py defines the transition's own script above this as the function
  `transition`. Atomic with the transition, the mark needs no 'before': no crash can fall
  between the two.

  Input:
    KEYS[1..n]      the transition's KEYS
    KEYS[n+1..n+3]  the bucket's due index, registry and pending writers (as mark.lua)
    ARGV[1..m]      the transition's ARGV
    ARGV[m+1..m+3]  workspace ID, visit by (ms), the bucket's wake channel

  Output:
    the transition's reply (its error raised again, after the mark). A transition that also
    returns a second value, true, made no work due sooner (accept.lua into a session that was
    ready already): its mark, and the wake-up, are skipped.

  Events: the transition's; the workspace on the wake channel (SPUBLISH), as mark.lua's 'alone'.
]]
local n, m = #KEYS - 3, #ARGV - 3
local keys, argv = {}, {}
for i = 1, n do keys[i] = KEYS[i] end
for i = 1, m do argv[i] = ARGV[i] end
-- Mark even when the transition failed part-way: a script's writes are not rolled back.
local ok, reply, unmoved = pcall(transition, keys, argv)
if ok and unmoved == true then return reply end
mark_due({KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]}, ARGV[m + 1], tonumber(ARGV[m + 2]), 'alone',
  ARGV[m + 3])
if not ok then error(reply) end
return reply
