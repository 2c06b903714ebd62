-- Runtime overrides: what every instance asks a few times a second.
--
-- KEYS[1]  the version hash: field = limit name, value = its version (override_log.lua)
-- KEYS[2]  the store's epoch (override_log.lua's mark_epoch)
--
-- Returns {now_ms, exists (0/1), {limit, version, limit, version, ...}, epoch (0: none)}. An
-- epoch other than the one an instance knew means the store lost its data (a restart
-- without persistence): see override_restore.lua. Writes nothing.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = redis.call('GET', KEYS[2]) or '0'
return {now, redis.call('EXISTS', KEYS[1]), redis.call('HGETALL', KEYS[1]), epoch}
