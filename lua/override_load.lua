-- Runtime overrides: one limit's entries and the version they belong to, expired ones dropped.
--
-- KEYS[1]  the version hash (see override_put.lua)
-- KEYS[2]  the limit's override hash
-- ARGV[1]  the limit name
--
-- Returns {now_ms, version, {tail, json, tail, json, ...}}. Dropping an expired entry bumps
-- the version, so every instance reloads the limit once more and forgets it too.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local kept = {}
local dropped = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ok, entry = pcall(cjson.decode, all[i + 1])
  if not ok or (type(entry) == 'table' and entry.x and entry.x <= now) then
    redis.call('HDEL', KEYS[2], all[i])
    dropped = dropped + 1
  else
    kept[#kept + 1] = all[i]
    kept[#kept + 1] = all[i + 1]
  end
end
local version
if dropped > 0 then
  version = bump(KEYS[1], ARGV[1])
else
  version = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
end
return {now, version, kept}
