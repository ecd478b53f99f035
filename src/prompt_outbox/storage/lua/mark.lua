--[[
  Mark: the workspace must be visited by a run loop no later than ARGV[2] (the due index).
  A writer whose transition may make work due sooner marks BEFORE it (so a crash after it
  leaves a mark, never missing work) and AFTER it, with the wake-up; a holder letting a lock
  go marks only after (ALONE). A mark only ever lowers (ZADD LT). A run loop raises or
  removes it (unmark.lua) only against the generation below, and never while a BEFORE mark
  younger than its grace still waits for its AFTER (the pending count).

  Input:
    KEYS[1]    the bucket's due index (outboxdue:{outbox-b<N>})
    KEYS[2]    the bucket's registry (outboxregistry:{outbox-b<N>}): workspace -> generation
    KEYS[3]    the bucket's pending writers (outboxpending:{outbox-b<N>}): workspace -> "n:us"
    ARGV[1]    workspace ID
    ARGV[2]    visit by, ms
    ARGV[3]    'before' | 'after' (closes a 'before') | 'alone' (a change already in place)
    ARGV[4]    the bucket's wake channel (a shard channel in the bucket's slot)

  Output:
    {'ok'}

  Events: none (a wake-up message, SPUBLISH, for 'after' and 'alone').
]]
mark_due(KEYS, ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4])
return {'ok'}
