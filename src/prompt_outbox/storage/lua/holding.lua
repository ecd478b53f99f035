--[[
  Holding (read only): what one workspace holds against its byte budget, as accept.lua
  counts it (lib.lua budget().holding): its queued entries' bytes, and what its event logs and its
  markers took in the windows still counted. O(1): a few fields, no entry or event read.

  Input:
    KEYS[1]    the workspace's count (HASH: BYTES_TOTAL)
    KEYS[2]    its written bytes (HASH: the windows)

  Output:
    {'ok', queued, logs, markers}

  Events: none.
]]
local h = budget().holding({[COUNT] = KEYS[1], [LOGBYTES] = KEYS[2]})
return {'ok', h.queued, h.l0 + h.l1, h.m0 + h.m1}
