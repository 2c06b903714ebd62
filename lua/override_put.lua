-- Runtime overrides: sets one key's override of one limit, in force on every instance once
-- they see the limit's version move (keys and log: override_log.lua).
--
-- KEYS  the version hash, the entry hash, the change log, the expiry index, the floor, the
--       history, the store's epoch (marked: override_log.lua)
-- ARGV[1]  the limit name
-- ARGV[2]  the key tail
-- ARGV[3]  the entry as a JSON object without its expiry, e.g. {"k":["acme"],"b":200}
-- ARGV[4]  time to live in ms; 0 = until deleted
-- ARGV[5]  most entries the limit may hold (expired ones are dropped first)
--
-- The expiry ("x", ms of Redis TIME) is written here so every instance reads one clock.
-- Returns {1, now_ms, version}, or {0, now_ms, count} when the limit is full.

local now = now_ms()
mark_epoch(KEYS[7])
local max = tonumber(ARGV[5])
local changed = sweep(KEYS[2], KEYS[4], now)

if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then
  local count = redis.call('HLEN', KEYS[2])
  if count >= max then
    if #changed > 0 then
      log_changes(KEYS[3], KEYS[6], KEYS[5], bump(KEYS[1], ARGV[1]), changed, max)
    end
    return {0, now, count}
  end
end

local value = ARGV[3]
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  local at = string.format('%d', now + ttl)
  value = '{"x":' .. at .. ',' .. string.sub(value, 2)
  redis.call('ZADD', KEYS[4], at, ARGV[2])
else
  redis.call('ZREM', KEYS[4], ARGV[2])
end
redis.call('HSET', KEYS[2], ARGV[2], value)
changed[#changed + 1] = ARGV[2]
local version = bump(KEYS[1], ARGV[1])
log_changes(KEYS[3], KEYS[6], KEYS[5], version, changed, max)
return {1, now, version}
