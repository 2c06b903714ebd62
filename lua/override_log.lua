-- Runtime overrides: versions, the change log and the expiry index of a limit's entries,
-- prefixed to the scripts that change or read them (override_put, override_delete,
-- override_changes, override_restore).
--
-- Per limit, in one Cluster slot with every other override key:
--   the version hash  field = limit name, value = its version, moved by every change
--   the entry hash    field = escaped key tail, value = compact JSON, expiry ("x") first
--   the change log    sorted set: member = key tail, score = the version that last changed it
--   the expiry index  sorted set: member = key tail, score = its expiry, ms of Redis TIME
--   the history       sorted set of the versions issued, newest last
--   the floor         the newest version trimmed from the log or the history
-- An instance holding version v reads the log above v and only the entries named there, so a
-- change costs O(log n + changed), not a read of every entry by every instance. It reads the
-- whole limit instead when the log cannot tell: v older than the floor, v not in the history
-- (the store lost changes: a lossy failover, an older RDB), the newest version not in the
-- history (an older release changed the limit), or more changes than a catch-up carries.

-- Expired entries dropped per call: bounded work; the rest go at the next calls.
local MAX_SWEEP = 100

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- bump(versions, limit) -> the limit's new version: above its last one and at least this
-- call's TIME in microseconds. A version is never handed out twice, even when the store lost
-- the last ones (a lossy failover, an older RDB): the counter then restarts from the clock,
-- past every version issued before, so an instance holding an older table always sees the
-- version move and catches up. Versions stay below 2^53, exact as sorted set scores.
local function bump(versions, limit)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('HGET', versions, limit) or '0') or 0
  local version = math.max(last + 1, now_us)
  redis.call('HSET', versions, limit, string.format('%d', version))
  return version
end

-- Marks the store with an epoch, this call's TIME in µs, unless it has one: every change
-- does, so a store that lost its data (restarted empty) shows another epoch, or none, to the
-- instances that knew the old one (override_poll.lua, override_restore.lua).
local function mark_epoch(key)
  local t = redis.call('TIME')
  redis.call('SET', key, t[1] .. string.rep('0', 6 - #t[2]) .. t[2], 'NX')
end

-- Drops up to MAX_SWEEP entries whose expiry has passed; returns their tails.
local function sweep(hash, expiries, now)
  local expired = redis.call('ZRANGEBYSCORE', expiries, '-inf', now, 'LIMIT', 0, MAX_SWEEP)
  if #expired > 0 then
    redis.call('HDEL', hash, unpack(expired))
    redis.call('ZREM', expiries, unpack(expired))
  end
  return expired
end

-- Records that `tails` changed at `version`. The log keeps one member per tail ever changed
-- and the history one per version, so both grow: past twice `max` members the oldest go, and
-- the floor says up to which version they are no longer complete.
local function log_changes(log, history, floor, version, tails, max)
  local score = string.format('%d', version)
  for i = 1, #tails do
    redis.call('ZADD', log, score, tails[i])
  end
  redis.call('ZADD', history, score, score)
  for _, set in ipairs({log, history}) do
    local size = redis.call('ZCARD', set)
    if size > 2 * max then
      local trimmed = redis.call('ZPOPMIN', set, size - max)
      local newest = tonumber(trimmed[#trimmed])
      if newest > tonumber(redis.call('GET', floor) or '0') then
        redis.call('SET', floor, trimmed[#trimmed])
      end
    end
  end
end

-- The expiry of a stored entry, read without decoding its JSON (put writes "x" first).
local function expiry_of(json)
  return tonumber(string.match(json, '^{"x":(%d+)'))
end
