-- Runtime overrides: writes back what an instance still holds after the store lost its data
-- (a Redis restarted without persistence). Only the first instance to ask writes: once the
-- version hash exists again, the others load what it wrote.
--
-- KEYS[1]      the version hash (see override_put.lua)
-- KEYS[2..n]   the override hashes of the limits named in ARGV, in order
-- ARGV         per limit: name, number of entries, then tail and JSON per entry
--
-- Returns 1 when written, 0 when the version hash existed already.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = 1
for k = 2, #KEYS do
  local limit = ARGV[at]
  local count = tonumber(ARGV[at + 1])
  at = at + 2
  for i = 1, count do
    local ok, entry = pcall(cjson.decode, ARGV[at + 1])
    if ok and type(entry) == 'table' and not (entry.x and entry.x <= now) then
      redis.call('HSET', KEYS[k], ARGV[at], ARGV[at + 1])
    end
    at = at + 2
  end
  bump(KEYS[1], limit)
end
return 1
