-- Runtime overrides: writes back what an instance still holds after the store lost its data
-- (a Redis restarted without persistence). Only the first instance to ask writes: once the
-- version hash exists again, the others catch up with what it wrote.
--
-- KEYS[1]  the version hash; then per limit named in ARGV, in order: its entry hash, change
--          log, expiry index, floor and history (override_log.lua)
-- ARGV[1]  most entries a limit may hold (sizes the log)
-- ARGV[2..] per limit: name, number of entries, then tail and JSON per entry
--
-- Returns 1 when written, 0 when the version hash existed already.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local now = now_ms()
local max = tonumber(ARGV[1])
local at = 2
for k = 2, #KEYS, 5 do
  local hash, log, expiries, floor, history = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local limit = ARGV[at]
  local count = tonumber(ARGV[at + 1])
  at = at + 2
  local written = {}
  for i = 1, count do
    local tail, json = ARGV[at], ARGV[at + 1]
    local expires = expiry_of(json)
    if not (expires and expires <= now) then
      redis.call('HSET', hash, tail, json)
      if expires then
        redis.call('ZADD', expiries, string.format('%d', expires), tail)
      end
      written[#written + 1] = tail
    end
    at = at + 2
  end
  -- Every instance reads the whole limit again: what it held may differ from what is here.
  local version = bump(KEYS[1], limit)
  log_changes(log, history, floor, version, written, max)
  redis.call('SET', floor, string.format('%d', version))
end
return 1
