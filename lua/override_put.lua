-- Runtime overrides: sets one key's override of one limit, in force on every instance once
-- they see the limit's version move.
--
-- KEYS[1]  the version hash: field = limit name, value = its version, changed by every change
--          (lua/override_version.lua: never the same twice)
-- KEYS[2]  the limit's override hash: field = escaped key tail, value = compact JSON
-- ARGV[1]  the limit name
-- ARGV[2]  the key tail
-- ARGV[3]  the entry as a JSON object without its expiry, e.g. {"k":["acme"],"b":200}
-- ARGV[4]  time to live in ms; 0 = until deleted
-- ARGV[5]  most entries the limit may hold (expired ones are dropped first)
--
-- The expiry ("x", ms of Redis TIME) is written here so every instance reads one clock.
-- Returns {1, now_ms, version}, or {0, now_ms, count} when the limit is full.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local dropped = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ok, entry = pcall(cjson.decode, all[i + 1])
  if not ok or (type(entry) == 'table' and entry.x and entry.x <= now) then
    redis.call('HDEL', KEYS[2], all[i])
    dropped = dropped + 1
  end
end

if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then
  local count = redis.call('HLEN', KEYS[2])
  if count >= tonumber(ARGV[5]) then
    if dropped > 0 then
      bump(KEYS[1], ARGV[1])
    end
    return {0, now, count}
  end
end

local value = ARGV[3]
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  value = '{"x":' .. string.format('%d', now + ttl) .. ',' .. string.sub(value, 2)
end
redis.call('HSET', KEYS[2], ARGV[2], value)
return {1, now, bump(KEYS[1], ARGV[1])}
