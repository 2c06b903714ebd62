-- tollgate token bucket: decides N buckets all-or-nothing in one atomic call.
--
-- KEYS[i]     bucket i: a hash {tokens, ts}, ts in microseconds of this server's TIME
-- ARGV[4i-3]  rate of bucket i, tokens per second (> 0, may be fractional)
-- ARGV[4i-2]  burst of bucket i: its capacity (>= 1)
-- ARGV[4i-1]  cost to charge bucket i (>= 1)
-- ARGV[4i]    "1" if bucket i is a shadow limit: reported, never denies
--
-- Returns {allowed, tokens_1, enough_1, ..., tokens_n, enough_n, now}:
--   allowed   1 when every non-shadow bucket holds its cost; only then is anything charged
--             (each bucket that can pay, shadow ones included)
--   tokens_i  what bucket i holds after this call, as a string so fractions survive the reply
--   enough_i  1 when bucket i held its cost
--   now       this call's TIME in microseconds, as a string: the `ts` it wrote. On a Redis
--             Cluster, a request whose buckets span slots is decided per slot, and a charge
--             that must be undone is refunded by lua/refund.lua, which needs this moment.
--
-- The clock is Redis's own (TIME), never the caller's, so instances with skewed clocks agree.
-- Both branches persist {tokens, now} and PEXPIRE the key to twice its full-refill time, so
-- idle buckets delete themselves and an absent bucket means a full one.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local n = #KEYS
local tokens, costs, enough = {}, {}, {}
local allowed = 1

for i = 1, n do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst = tonumber(ARGV[4 * i - 2])
  local cost = tonumber(ARGV[4 * i - 1])
  local shadow = ARGV[4 * i] == '1'
  local stored = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local level, ts = tonumber(stored[1]), tonumber(stored[2])
  if level == nil or ts == nil then
    level = burst
  else
    local elapsed = now - ts
    if elapsed < 0 then elapsed = 0 end
    level = math.min(burst, level + elapsed * rate / 1000000)
  end
  tokens[i], costs[i] = level, cost
  enough[i] = level >= cost
  if not enough[i] and not shadow then allowed = 0 end
end

local reply = {allowed}
for i = 1, n do
  if allowed == 1 and enough[i] then tokens[i] = tokens[i] - costs[i] end
  local rate, burst = tonumber(ARGV[4 * i - 3]), tonumber(ARGV[4 * i - 2])
  local level = string.format('%.17g', tokens[i])
  redis.call('HSET', KEYS[i], 'tokens', level, 'ts', string.format('%d', now))
  redis.call('PEXPIRE', KEYS[i], math.ceil(2 * burst / rate) * 1000)
  reply[2 * i] = level
  reply[2 * i + 1] = enough[i] and 1 or 0
end
reply[2 * n + 2] = string.format('%d', now)
return reply
