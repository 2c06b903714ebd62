-- tollgate peek: one key as lua/token_bucket.lua would see it now, read-only (GET /v1/buckets).
-- Loaded with lua/calendar.lua (period_bounds), lua/bounds.lua, lua/stored.lua (read_bucket, refilled),
-- lua/groups.lua (read_groups) and lua/global.lua in front of it. Writes nothing: a peek charges
-- nothing, refreshes no expiry and leaves `ts` alone, so the next check sees the same bucket.
--
-- KEYS[1]  a bucket, "v1:<debt> <ts>" (lua/stored.lua), or a quota, hash {used, start}
-- ARGV[1]  a bucket's rate, tokens per second; or a quota's period code ('h', 'd', 'w', 'm');
--          or 'L' for a concurrency key (a sorted set of leases scored by expiry); or
--          'R<k|r><rate>' for a reserving bucket; 'B<rate>' for a borrowing bucket;
--          'G<floor>:<rate>' for a global limit's key in a region (lua/global.lua in front)
-- ARGV[2]  a bucket's burst; or the quota; or the most leases held at once
--
-- Returns one string: "level" for a bucket (its tokens now, refilled exactly as token_bucket.lua
-- refills: absent or mangled = full, tokens = burst - debt, a clock gone backwards adds
-- nothing; an earlier release's hash is read, not converted);
-- "level t w" for a quota (what is left of it, seconds until its period ends, the period's
-- length in seconds); "level reserved held" for a reserving bucket (the tokens and the count
-- of its reservations held now); "level held groups" for a borrowing bucket (its level with
-- the held tokens not refilled and ended groups counted as used, as token_bucket.lua reads
-- it; the micro-tokens its live groups hold, and how many groups hold them). Numbers as
-- token_bucket.lua replies them.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local now_s = t[1] + 0
local burst = ARGV[2] + 0

if ARGV[1] == 'h' or ARGV[1] == 'd' or ARGV[1] == 'w' or ARGV[1] == 'm' then
  local start, stop = period_bounds(ARGV[1], now_s)
  local stored = redis.pcall('HMGET', KEYS[1], 'used', 'start')
  local level = burst
  if not stored.err and tonumber(stored[2]) == start then
    level = burst - (tonumber(stored[1]) or 0)
  end
  return string.format('%.17g %d %d', level, stop - now_s, stop - start)
end

if string.byte(ARGV[1]) == 76 then
  -- 'L': a concurrency key; its level is the slots free now (leases expiring after now).
  local held = redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
  return string.format('%.17g', burst - held)
end

-- 'R<k|r><rate>': a reserving bucket. Its level as the next check finds it (expired
-- reservations given back under 'r'), then the tokens and the count of reservations held.
if string.byte(ARGV[1]) == 71 then
  -- 'G': a global limit's key in a region (lua/global.lua): its level under its share.
  local g = GLOBAL[ARGV[1]]
  if not g then refuse(1, 'global') end
  local debt, at, _, rest = read_bucket(KEYS[1], burst)
  local n = global_numbers(g, burst, KEYS[1])
  local level
  if rest and rest ~= '' then
    -- Instances hold tokens of it: its held groups count (lua/global.lua).
    level = global_lent(n, {gd = 0, gx = 0, gr = 0, gi = 0}, debt, at, rest, now)
  else
    level = global_level(n, debt, at, now)
  end
  return string.format('%.6f', level / 1000000)
end

local rate, back, reserved, count = ARGV[1], 0, nil, 0
if string.byte(rate) == 82 then
  local ts = string.format('%d', now)
  local held = redis.call('ZRANGEBYSCORE', KEYS[1] .. ':r', '(' .. ts, '+inf')
  reserved = 0
  for _, member in ipairs(held) do
    reserved = reserved + (tonumber(string.match(member, ':(%d+)$')) or 0)
  end
  count = #held
  if string.sub(rate, 2, 2) == 'r' then
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1] .. ':r', '-inf', ts)) do
      back = back + (tonumber(string.match(member, ':(%d+)$')) or 0)
    end
  end
  rate = string.sub(rate, 3)
end
local debt, at, _, rest = read_bucket(KEYS[1], burst)
local borrowing = string.byte(rate) == 66
if borrowing or (rest and rest ~= '' and not reserved) then
  -- Held groups (a borrowing bucket): as token_bucket.lua's lent reads them, without writing.
  if borrowing then rate = string.sub(rate, 2) end
  rate = rate + 0
  local g, _, held = read_groups(rest)
  local live = 0
  debt = debt or 0
  at = at or now
  for _, group in ipairs(g) do
    if group[2] > 0 and group[1] <= now then
      debt = refilled(debt, at, group[1], rate)
      if debt < held then debt = held end
      if group[1] > at + 0 then at = group[1] end
      held = held - group[2]
    elseif group[2] > 0 then
      live = live + 1
    end
  end
  debt = refilled(debt, at, now, rate)
  if debt < held then debt = held end
  local level = string.format('%.6f', (burst * 1000000 - debt) / 1000000)
  if borrowing then return level .. string.format(' %d %d', held, live) end
  return level
end
if debt == nil then
  debt = 0
else
  debt = refilled(debt, at, now, rate + 0)
end
debt = debt - back * 1000000
if debt < 0 then debt = 0 end
local level = string.format('%.6f', (burst * 1000000 - debt) / 1000000)
if reserved then return level .. string.format(' %d %d', reserved, count) end
return level
