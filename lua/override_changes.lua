-- Runtime overrides: what changed in one limit since the version an instance holds
-- (keys and log: override_log.lua). Expired entries are dropped on the way, so every
-- instance learns of them as of any other change.
--
-- KEYS  the version hash, the entry hash, the change log, the expiry index, the floor, the
--       history
-- ARGV[1]  the limit name
-- ARGV[2]  the version the caller holds (0: none)
-- ARGV[3]  most changed entries to send; more than that and the whole limit goes
-- ARGV[4]  most entries the limit may hold (sizes the log)
--
-- Returns {now_ms, version, 0, {tail, json, ...}}: the entries changed since, a removed one
-- with an empty value; or {now_ms, version, 1, {tail, json, ...}}: every entry, when the
-- log cannot tell what changed (override_log.lua) or more than ARGV[3] entries did.

local now = now_ms()
local max = tonumber(ARGV[4])
local swept = sweep(KEYS[2], KEYS[4], now)
local version
if #swept > 0 then
  version = bump(KEYS[1], ARGV[1])
  log_changes(KEYS[3], KEYS[6], KEYS[5], version, swept, max)
else
  version = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
end

local function whole()
  local all = redis.call('HGETALL', KEYS[2])
  -- Entries an older release wrote have no place in the expiry index yet: give them one.
  if redis.call('EXISTS', KEYS[4]) == 0 then
    for i = 1, #all, 2 do
      local at = expiry_of(all[i + 1])
      if at then
        redis.call('ZADD', KEYS[4], string.format('%d', at), all[i])
      end
    end
  end
  return {now, version, 1, all}
end

local since = tonumber(ARGV[2])
if since == 0 or since > version then
  return whole()
end
if since < tonumber(redis.call('GET', KEYS[5]) or '0') then
  return whole()
end
if since < version and not redis.call('ZSCORE', KEYS[6], ARGV[2]) then
  return whole()
end
local newest = redis.call('ZREVRANGE', KEYS[6], 0, 0, 'WITHSCORES')
if version > 0 and (newest[2] == nil or tonumber(newest[2]) ~= version) then
  return whole()
end
local most = tonumber(ARGV[3])
local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[2], '+inf', 'LIMIT', 0, most + 1)
if #changed > most then
  return whole()
end
local out = {}
if #changed > 0 then
  local values = redis.call('HMGET', KEYS[2], unpack(changed))
  for i = 1, #changed do
    out[2 * i - 1] = changed[i]
    out[2 * i] = values[i] or ''
  end
end
return {now, version, 0, out}
