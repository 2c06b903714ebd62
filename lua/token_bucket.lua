-- tollgate token bucket and calendar quota: decides N keys all-or-nothing in one atomic call.
-- Prefixed with lua/calendar.lua (period_bounds) when loaded.
--
-- KEYS[i]     key i: a bucket, hash {tokens, ts} (ts in microseconds of this server's TIME),
--             or a quota, hash {used, start} (start: Unix second its period began)
-- ARGV[4i-3]  a bucket's rate, tokens per second (> 0, may be fractional); or a quota's period
--             code: 'h' hour, 'd' day, 'w' ISO week, 'm' calendar month (UTC)
-- ARGV[4i-2]  a bucket's burst: its capacity (>= 1); or the quota: at most this per period
-- ARGV[4i-1]  cost to charge key i (>= 0; 0 asks only that the key is not used up: a
--             charge = "report" limit, charged later by lua/report.lua)
-- ARGV[4i]    "1" if key i is a shadow limit: reported, never denies
--
-- Returns {allowed, tokens_1, enough_1, ..., tokens_n, enough_n, now, t_q1, w_q1, ...}:
--   allowed   1 when every non-shadow key holds its cost; only then is anything charged
--             (each key that can pay, shadow ones included)
--   tokens_i  what key i holds after this call (a quota: what is left of it), as a string so
--             fractions survive the reply
--   enough_i  1 when key i held its cost (and more than 0)
--   now       this call's TIME in microseconds, as a string: the `ts` it wrote. On a Redis
--             Cluster, a request whose keys span slots is decided per slot, and a charge that
--             must be undone is refunded by lua/refund.lua, which needs this moment.
--   t_q, w_q  for each quota key, in KEYS order: seconds until its period ends, and the
--             period's length in seconds
--
-- The clock is Redis's own (TIME), never the caller's, so instances with skewed clocks agree.
-- A bucket persists {tokens, now} in both branches and expires when it would be full again
-- (absent means full), and never before twice its full-refill time. A quota is written only
-- when charged and expires when its period ends; a count from an earlier period is void.

local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now = now_s * 1000000 + tonumber(t[2])

local n = #KEYS
local tokens, costs, enough, starts, stops, current = {}, {}, {}, {}, {}, {}
local allowed = 1

for i = 1, n do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst = tonumber(ARGV[4 * i - 2])
  local cost = tonumber(ARGV[4 * i - 1])
  local shadow = ARGV[4 * i] == '1'
  local level
  if rate == nil then
    local start, stop = period_bounds(ARGV[4 * i - 3], now_s)
    local stored = redis.call('HMGET', KEYS[i], 'used', 'start')
    local used = 0
    if tonumber(stored[2]) == start then
      used = tonumber(stored[1]) or 0
      current[i] = true
    end
    level = burst - used
    starts[i], stops[i] = start, stop
  else
    local stored = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
    local ts
    level, ts = tonumber(stored[1]), tonumber(stored[2])
    if level == nil or ts == nil then
      level = burst
    else
      local elapsed = now - ts
      if elapsed < 0 then elapsed = 0 end
      level = math.min(burst, level + elapsed * rate / 1000000)
    end
  end
  tokens[i], costs[i] = level, cost
  enough[i] = level >= cost and level > 0
  if not enough[i] and not shadow then allowed = 0 end
end

local reply = {allowed}
local windows = {}
for i = 1, n do
  local charged = allowed == 1 and enough[i]
  if charged then tokens[i] = tokens[i] - costs[i] end
  local burst = tonumber(ARGV[4 * i - 2])
  local level = string.format('%.17g', tokens[i])
  if starts[i] then
    if charged and costs[i] > 0 and current[i] then
      -- This period's count exists, and so does its expiry.
      redis.call('HINCRBY', KEYS[i], 'used', costs[i])
    elseif charged and costs[i] > 0 then
      redis.call('HSET', KEYS[i], 'used', string.format('%d', costs[i]),
        'start', string.format('%d', starts[i]))
      redis.call('PEXPIRE', KEYS[i], math.ceil((stops[i] * 1000000 - now) / 1000))
    end
    windows[#windows + 1] = stops[i] - now_s
    windows[#windows + 1] = stops[i] - starts[i]
  else
    local rate = tonumber(ARGV[4 * i - 3])
    redis.call('HSET', KEYS[i], 'tokens', level, 'ts', string.format('%d', now))
    -- A bucket in debt (charged by reports) needs longer than twice its burst to refill.
    local missing = math.max(2 * burst, burst - tokens[i])
    redis.call('PEXPIRE', KEYS[i], math.ceil(missing / rate) * 1000)
  end
  reply[2 * i] = level
  reply[2 * i + 1] = enough[i] and 1 or 0
end
reply[2 * n + 2] = string.format('%d', now)
for _, value in ipairs(windows) do reply[#reply + 1] = value end
return reply
