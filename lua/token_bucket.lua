-- tollgate token bucket: decides N buckets all-or-nothing in one atomic call.
--
-- KEYS[i]     bucket i: a hash {tokens, ts}, ts in microseconds of this server's TIME
-- ARGV[4i-3]  rate of bucket i, tokens per second (> 0, may be fractional)
-- ARGV[4i-2]  burst of bucket i: its capacity (>= 1)
-- ARGV[4i-1]  cost to charge bucket i (>= 1)
-- ARGV[4i]    "1" if bucket i is a shadow limit: reported, never denies
--
-- Returns one string, "allowed now tokens_1 enough_1 ... tokens_n enough_n", space-separated:
--   allowed   1 when every non-shadow bucket holds its cost; only then is anything charged
--             (each bucket that can pay, shadow ones included)
--   now       this call's TIME in microseconds: the `ts` it wrote. On a Redis Cluster, a
--             request whose buckets span slots is decided per slot, and a charge that must be
--             undone is refunded by lua/refund.lua, which needs this moment.
--   tokens_i  what bucket i holds after this call, the text written to the hash (%.17g, so
--             the exact double)
--   enough_i  1 when bucket i held its cost
--
-- The clock is Redis's own (TIME), never the caller's, so instances with skewed clocks agree.
-- Both branches persist {tokens, now}. The key expires when the bucket would be full again
-- (the next millisecond after it, so never before): an absent bucket reads as full, so that
-- changes no decision and keeps only the buckets that matter.
--
-- Written for Redis's CPU, which every check of a fleet shares: one string reply (an array
-- costs Redis a deferred-length reply block), arguments coerced by arithmetic rather than by
-- calls to tonumber, each double formatted once, and `ts` spelled from TIME's own digits.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local us = t[2]
if #us < 6 then us = string.rep('0', 6 - #us) .. us end
local ts = t[1] .. us

-- reply[2i+1], reply[2i+2]: bucket i's tokens (a number until written) and enough flag.
local n = #KEYS
local reply, allowed = {'1', ts}, '1'
for i = 1, n do
  local j = 4 * i
  local burst = ARGV[j - 2] + 0
  local stored = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  -- tonumber, not arithmetic: a field someone else mangled reads as absent, i.e. full.
  local level, at = tonumber(stored[1]), tonumber(stored[2])
  if level == nil or at == nil then
    level = burst
  elseif now > at then
    level = level + (now - at) * ARGV[j - 3] / 1000000
    if level > burst then level = burst end
  end
  reply[2 * i + 1] = level
  if level >= ARGV[j - 1] + 0 then
    reply[2 * i + 2] = '1'
  else
    reply[2 * i + 2] = '0'
    if ARGV[j] ~= '1' then allowed = '0' end
  end
end
reply[1] = allowed

for i = 1, n do
  local j, key = 4 * i, KEYS[i]
  local level = reply[2 * i + 1]
  if allowed == '1' and reply[2 * i + 2] == '1' then level = level - ARGV[j - 1] end
  local text = string.format('%.17g', level)
  redis.call('HSET', key, 'tokens', text, 'ts', ts)
  -- Redis deletes a key once its millisecond clock passes the deadline: the millisecond after
  -- the one in which the bucket is full again.
  local full_ms = (now + (ARGV[j - 2] - level) / ARGV[j - 3] * 1000000) / 1000
  redis.call('PEXPIREAT', key, string.format('%d', full_ms - full_ms % 1 + 1))
  reply[2 * i + 1] = text
end
return table.concat(reply, ' ')
