-- Runtime overrides: what every instance asks a few times a second.
--
-- KEYS[1]  the version hash: field = limit name, value = its version (override_version.lua)
--
-- Returns {now_ms, exists (0/1), {limit, version, limit, version, ...}}. A version hash that
-- does not exist while an instance knew one means the store lost its data (a restart without
-- persistence): see override_restore.lua.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('EXISTS', KEYS[1]), redis.call('HGETALL', KEYS[1])}
