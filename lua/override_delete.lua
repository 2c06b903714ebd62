-- Runtime overrides: removes one key's override of one limit, and any expired ones with it.
--
-- KEYS[1]  the version hash (see override_put.lua)
-- KEYS[2]  the limit's override hash
-- ARGV[1]  the limit name
-- ARGV[2]  the key tail
--
-- Returns {removed (1 or 0, expired ones not counted), now_ms}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local removed = redis.call('HDEL', KEYS[2], ARGV[2])
local changed = removed
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ok, entry = pcall(cjson.decode, all[i + 1])
  if not ok or (type(entry) == 'table' and entry.x and entry.x <= now) then
    redis.call('HDEL', KEYS[2], all[i])
    changed = changed + 1
  end
end
if changed > 0 then
  bump(KEYS[1], ARGV[1])
end
return {removed, now}
