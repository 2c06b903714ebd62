-- tollgate: a global limit's bucket in a region (docs/DESIGN.md, "One limit across regions").
-- Loaded after lua/bounds.lua, in front of lua/token_bucket.lua and lua/global_share.lua.
--
-- A global limit's key is decided against the region's numbers for it: its floor (a fixed
-- fraction of the limit's rate and burst, the argument 'G<floor in millionths>:<rate>') plus
-- the share the home last assigned, kept beside the bucket in KEYS[i] .. ':g' (same hash tag,
-- so the same Cluster slot) as "<rate, tokens/s> <size, whole tokens> <until, µs of TIME>".
-- The share counts while TIME is before `until`; after it, only the floor. The bucket keeps
-- "v1:<debt> <ts>" (lua/bounds.lua), the debt below the size it had at ts: floor + share when
-- ts < until, else the floor alone. Refill over [ts, now) is piecewise: floor + share's rate up to `until` (capped
-- at floor + share's size), then the floor's (capped at the floor's size), so a share that
-- lapsed without any event is never credited past its expiry. A share is only ever written by
-- lua/global_share.lua, which first brings the bucket to now under the old share: no stretch
-- before a change is refilled at the new rate, and a bucket never grows by a change (its level
-- stays, capped at a smaller size). An absent bucket is full at the current size. An absent
-- share record reads as none, and a debt then counts below the floor's size: never more
-- generous than the truth (the level it reads is at most the one the record would give).
-- No size is above the limit's burst (the cap): a share from a home with larger numbers for
-- the key is cut to them.

local GLOBAL = setmetatable({}, {__index = function(memo, s)
  local ppm, r = string.match(s, '^G(%d+):(.+)$')
  local v = false
  ppm, r = tonumber(ppm), tonumber(r)
  if ppm and r and ppm <= 1000000 and r > 0 and r < math.huge then
    v = {ppm = ppm, rate = r}
  end
  memo[s] = v
  return v
end})

-- The share beside `key`: its rate (tokens/s), size (micro-tokens) and until (µs); none is 0 0 0.
local function global_share(key)
  local v = redis.pcall('GET', key .. ':g')
  if type(v) ~= 'string' then return 0, 0, 0 end
  local r, c, u = string.match(v, '^(%S+) (%d+) (%d+)$')
  r, c, u = tonumber(r), tonumber(c), tonumber(u)
  if not (r and c and u and r >= 0 and r < math.huge and c <= MAX_COUNT) then return 0, 0, 0 end
  return r, c * 1000000, u
end

-- The region's numbers for a key: {fr, fc, sr, sc, u, s1, r1}: the floor's rate (tokens/s)
-- and size (micro-tokens), the share's, its end, and the size and rate while it counts.
local function global_numbers(g, burst, key)
  local fr, fc = g.rate * g.ppm / 1000000, burst * g.ppm
  local sr, sc, u = global_share(key)
  local cap = burst * 1000000
  local s1 = fc + sc
  if s1 > cap then s1 = cap end
  return {fr = fr, fc = fc, sr = sr, sc = sc, u = u, s1 = s1, r1 = fr + sr}
end

-- The level (micro-tokens) at `now` of a bucket stored as debt at `at` (nil: absent).
local function global_level(n, debt, at, now)
  if not debt then
    if now < n.u then return n.s1 end
    return n.fc
  end
  at = tonumber(at)
  if at < n.u then
    local level = n.s1 - debt
    local t1 = now
    if t1 > n.u then t1 = n.u end
    if t1 > at then level = level + math.floor((t1 - at) * n.r1) end
    if level > n.s1 then level = n.s1 end
    if now < n.u then return level end
    if level > n.fc then level = n.fc end
    level = level + math.floor((now - n.u) * n.fr)
    if level > n.fc then level = n.fc end
    return level
  end
  local level = n.fc - debt
  if now > at then level = level + math.floor((now - at) * n.fr) end
  if level > n.fc then level = n.fc end
  return level
end

-- Writes the bucket at `level` (micro-tokens) as of now (ts: its digits), to expire in the
-- millisecond after it is full again, piecewise as it refills.
local function global_write(key, n, level, now, ts)
  local debt, full
  if now < n.u then
    debt = n.s1 - level
    full = now + math.ceil(debt / n.r1)
    if full > n.u then
      local at_u = level + math.floor((n.u - now) * n.r1)
      if at_u > n.fc then at_u = n.fc end
      if n.fr > 0 then
        full = n.u + math.ceil((n.fc - at_u) / n.fr)
      else
        full = now + MAX_TTL_US
      end
    end
  else
    debt = n.fc - level
    if n.fr > 0 then full = now + math.ceil(debt / n.fr) else full = now + MAX_TTL_US end
  end
  if debt < 0 then debt = 0 end
  redis.call('SET', key, string.format('v1:%d ', debt) .. ts, 'PXAT', expire_at(now, full - now))
end
