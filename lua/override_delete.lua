-- Runtime overrides: removes one key's override of one limit, and expired ones with it
-- (keys and log: override_log.lua).
--
-- KEYS  the version hash, the entry hash, the change log, the expiry index, the floor, the
--       history, the store's epoch (marked: override_log.lua)
-- ARGV[1]  the limit name
-- ARGV[2]  the key tail
-- ARGV[3]  most entries the limit may hold (sizes the log)
--
-- Returns {removed (1 or 0, expired ones not counted), now_ms}.

local now = now_ms()
mark_epoch(KEYS[7])
local changed = sweep(KEYS[2], KEYS[4], now)
local removed = redis.call('HDEL', KEYS[2], ARGV[2])
if removed == 1 then
  redis.call('ZREM', KEYS[4], ARGV[2])
  changed[#changed + 1] = ARGV[2]
end
if #changed > 0 then
  log_changes(KEYS[3], KEYS[6], KEYS[5], bump(KEYS[1], ARGV[1]), changed, tonumber(ARGV[3]))
end
return {removed, now}
