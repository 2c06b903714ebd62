-- tollgate: a global limit's bucket in a region (docs/DESIGN.md, "One limit across regions").
-- Loaded after lua/bounds.lua, lua/stored.lua and lua/groups.lua, in front of lua/decide.lua,
-- lua/global_share.lua and lua/peek.lua.
--
-- A global limit's key is decided against the region's numbers for it: its floor (a fixed
-- fraction of the limit's rate and burst, the argument 'G<floor in millionths>:<rate>') plus
-- the share the home last assigned, kept beside the bucket in KEYS[i] .. ':g' (same hash tag,
-- so the same Cluster slot) as "<rate, tokens/s> <size, whole tokens> <until, µs of TIME>".
-- The share counts while TIME is before `until`; after it, only the floor. The bucket keeps
-- "v1:<debt> <ts>" (lua/stored.lua), the debt below the size it had at ts: floor + share when
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
--
-- A key instances borrow from (docs/DESIGN.md, "Borrowed tokens") keeps its held groups after
-- the debt and ts, as a borrowing bucket does (lua/token_bucket.lua), and held tokens do not
-- refill: the level is at most the size *in force* less what is held, at every moment. So when
-- the share is cut, or ends, the slices still out are counted against the smaller size (the
-- level may go below 0), and the region's tokens, its level and its instances' unused slices
-- together, never exceed the size the home counts for it (docs/DESIGN.md, "One limit across
-- regions"). The argument 'G<floor in millionths>:<grid>:<want>:<deadline>:<taken>:<unused>:
-- <incarnation>:<rate>' is a borrowing check (lua/token_bucket.lua's 'B' fields).

local GLOBAL = setmetatable({}, {__index = function(memo, s)
  local v = false
  local ppm, grid, want, gd, gx, gr, gi, r =
    string.match(s, '^G(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(.+)$')
  local lend
  if ppm then
    if tonumber(grid) > 0 then
      lend = {grid = tonumber(grid), want = tonumber(want), gd = tonumber(gd),
        gx = tonumber(gx) * 1000000, gr = tonumber(gr) * 1000000, gi = tonumber(gi)}
    else
      ppm = nil
    end
  else
    ppm, r = string.match(s, '^G(%d+):(.+)$')
  end
  ppm, r = tonumber(ppm), tonumber(r)
  if ppm and r and ppm <= 1000000 and r > 0 and r < math.huge then
    v = {ppm = ppm, rate = r, lend = lend}
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

-- The level at `to` of a bucket at `level` at `from`, no group ending between: refilled
-- piecewise around the share's end, capped at the size then less `held` (held tokens do not
-- refill). With nothing held, `global_level`'s arithmetic, operation for operation.
local function global_refill(n, level, from, to, held)
  if from < n.u then
    local t1 = to
    if t1 > n.u then t1 = n.u end
    if t1 > from then level = level + math.floor((t1 - from) * n.r1) end
    if level > n.s1 - held then level = n.s1 - held end
    if to < n.u then return level end
    if level > n.fc - held then level = n.fc - held end
    level = level + math.floor((to - n.u) * n.fr)
    if level > n.fc - held then level = n.fc - held end
    return level
  end
  if to > from then level = level + math.floor((to - from) * n.fr) end
  if level > n.fc - held then level = n.fc - held end
  return level
end

-- A borrowing read of a global key (lua/token_bucket.lua's `lent`, on the region's numbers):
-- reads its groups (`rest`) into lend.g and their incarnation into lend.inc, ends those whose
-- deadline has passed (the level refilled up to each, the group's tokens then used), applies
-- the slice given back (lend.gd, lend.gx, lend.gr, lend.gi). Returns the level now.
local function global_lent(n, lend, debt, at, rest, now)
  local g, inc, held = read_groups(rest)
  local size = n.fc
  if now < n.u then size = n.s1 end
  local level
  if not debt then
    -- Absent: full at the size now (an absent key holds no groups).
    level = size
    held = 0
    g = {}
  else
    at = tonumber(at)
    if at < n.u then level = n.s1 - debt else level = n.fc - debt end
  end
  local from = at or now
  local live = {}
  for _, group in ipairs(g) do
    if group[2] > 0 and group[1] <= now then
      level = global_refill(n, level, from, group[1], held)
      if group[1] > from then from = group[1] end
      held = held - group[2]
      lend.changed = true
    elseif group[2] > 0 then
      live[#live + 1] = group
    end
  end
  if debt then level = global_refill(n, level, from, now, held) end
  if #live > 0 then lend.inc = inc end
  for _, group in ipairs(live) do
    if group[1] == lend.gd and lend.gx > 0 and lend.gi == inc then
      local taken = math.min(lend.gx, group[2])
      group[2] = group[2] - taken
      level = level + math.min(lend.gr, taken)
      if level > size then level = size end
      lend.changed = true
    end
  end
  lend.g = live
  return level
end

-- When a bucket at `level` at `t` is full again (µs), piecewise as it refills.
local function global_full(n, level, t)
  if t < n.u then
    local full = t + math.ceil((n.s1 - level) / n.r1)
    if full > n.u then
      local at_u = level + math.floor((n.u - t) * n.r1)
      if at_u > n.fc then at_u = n.fc end
      if n.fr > 0 then
        full = n.u + math.ceil((n.fc - at_u) / n.fr)
      else
        full = t + MAX_TTL_US
      end
    end
    return full
  end
  if level > n.fc then level = n.fc end
  if n.fr > 0 then return t + math.ceil((n.fc - level) / n.fr) end
  return t + MAX_TTL_US
end

-- Writes the bucket at `level` (micro-tokens) as of now (ts: its digits), to expire in the
-- millisecond after it is full again, piecewise as it refills; with held groups (`groups`,
-- as lua/token_bucket.lua's lend_groups spells them, and `from`, the last live deadline)
-- written after it, counting its refill only from that deadline, so never before it ends.
local function global_write(key, n, level, now, ts, groups, from)
  local debt
  if now < n.u then debt = n.s1 - level else debt = n.fc - level end
  local full = global_full(n, level, from or now)
  if debt < 0 then debt = 0 end
  redis.call('SET', key, string.format('v1:%d ', debt) .. ts .. (groups or ''), 'PXAT',
    expire_at(now, full - now))
end
