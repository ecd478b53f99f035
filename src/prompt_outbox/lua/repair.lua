-- Repair: re-derive one session's workspace indexes from its lists. ARGV: ses, now_ms.
refresh(KEYS, ARGV[1], tonumber(ARGV[2]))
return 1
