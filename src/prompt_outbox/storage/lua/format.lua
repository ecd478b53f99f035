--[[
  Record the storage format this code writes, unless Valkey holds a newer one (or one it
  cannot read): a worker of an older version must not write into a newer store.

  Input:
    KEYS[1]    FORMAT_KEY (STRING: the newest storage format that has written here)
    ARGV[1]    this code's format (an integer)

  Output:
    {'ok', format}      recorded, or already there: the format now in force
    {'newer', found}    a newer format (or a value that is not one) is there: nothing written

  Events: none.
]]
local raw = redis.call('GET', KEYS[1])
local mine = tonumber(ARGV[1])
if raw then
  local found = tonumber(raw)
  if not found or found ~= math.floor(found) or found > mine then return {'newer', raw} end
  if found == mine then return {'ok', raw} end
end
redis.call('SET', KEYS[1], ARGV[1])
return {'ok', ARGV[1]}
