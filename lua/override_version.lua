-- Runtime overrides: the version of a limit's entries, prefixed to the scripts that change them
-- (override_put, override_delete, override_load, override_restore).
--
-- bump(versions, limit) -> the limit's new version: above its last one and at least this
-- call's TIME in microseconds. A version is never handed out twice, even when the store lost
-- the last ones (a lossy failover, an older RDB): the counter then restarts from the clock,
-- past every version issued before, so an instance holding an older table always sees the
-- version move (instances compare versions for equality) and reloads.

local function bump(versions, limit)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('HGET', versions, limit) or '0') or 0
  local version = math.max(last + 1, now_us)
  redis.call('HSET', versions, limit, string.format('%d', version))
  return version
end
