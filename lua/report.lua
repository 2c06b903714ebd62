-- tollgate report: charges costs known after the response (POST /report). Every charge is
-- applied; nothing is refused, except numbers a bucket cannot carry (lua/bounds.lua): then the
-- whole call is refused, before its first write. Prefixed with lua/calendar.lua
-- (period_bounds), lua/bounds.lua and lua/stored.lua when loaded.
--
-- KEYS[i]     key i, as lua/token_bucket.lua keeps it
-- ARGV[4i-3]  a bucket's rate, tokens per second; or a quota's period code ('h','d','w','m')
-- ARGV[4i-2]  a bucket's burst; or the quota
-- ARGV[4i-1]  the cost to charge (>= 0)
-- ARGV[4i]    a bucket's max_debt: the charge stops at -max_debt (a deeper debt already there
--             stays: nothing is given back)
--
-- Returns {tokens_1, ..., tokens_n, now, t_q1, w_q1, ...}: what each key holds afterwards (a
-- quota: what is left of it, negative when reports took it past its total), as strings; this
-- call's TIME in microseconds; for each quota key in KEYS order, seconds until its period ends
-- and the period's length.
--
-- A bucket is its debt (lua/stored.lua); one in debt expires only when it would be full again
-- (absent means full), so a debt is never forgotten early; a quota expires when its period
-- ends.

local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now = now_s * 1000000 + tonumber(t[2])

for i = 1, #KEYS do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst, cost = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1])
  if rate == nil then
    check_quota(i, burst, cost)
  else
    check_bucket(i, rate, burst, cost, tonumber(ARGV[4 * i]))
  end
end

-- A count this large is used up whatever the quota (at most MAX_COUNT): capped where doubles
-- still hold every integer, so '%d' always prints it exactly.
local MAX_USED = 4503599627370496

local reply, windows = {}, {}
for i = 1, #KEYS do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst = tonumber(ARGV[4 * i - 2])
  local cost = tonumber(ARGV[4 * i - 1])
  local level
  if rate == nil then
    local start, stop = period_bounds(ARGV[4 * i - 3], now_s)
    -- pcall: a string is a bucket this limit kept before it became a quota (WRONGTYPE).
    local stored = redis.pcall('HMGET', KEYS[i], 'used', 'start')
    local used = 0
    if stored.err then
      redis.call('DEL', KEYS[i])
    elseif tonumber(stored[2]) == start then
      used = tonumber(stored[1]) or 0
    end
    used = math.min(used + cost, MAX_USED)
    redis.call('HSET', KEYS[i], 'used', string.format('%d', used),
      'start', string.format('%d', start))
    redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil((stop * 1000000 - now) / 1000)))
    level = burst - used
    windows[#windows + 1] = stop - now_s
    windows[#windows + 1] = stop - start
    reply[i] = string.format('%.17g', level)
  else
    local max_debt = tonumber(ARGV[4 * i])
    -- Micro-tokens (lua/stored.lua): the debt refilled to now, then charged down to
    -- -max_debt at most (a deeper debt already there stays).
    local debt, at, old = read_bucket(KEYS[i], burst)
    if debt == nil then
      debt = 0
    else
      debt = refilled(debt, at, now, rate)
    end
    local deepest = (burst + max_debt) * 1000000
    local charged = debt + cost * 1000000
    if charged > deepest then charged = math.max(debt, deepest) end
    if charged ~= debt or old then
      redis.call('SET', KEYS[i], string.format('v1:%d %d', charged, now), 'PXAT', full_at(now, charged, rate))
    end
    level = (burst * 1000000 - charged) / 1000000
    reply[i] = string.format('%.6f', level)
  end
end
reply[#KEYS + 1] = string.format('%d', now)
for _, value in ipairs(windows) do reply[#reply + 1] = value end
return reply
