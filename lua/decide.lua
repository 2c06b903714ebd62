-- tollgate token bucket, its general form: the requests lua/token_bucket.lua's plain loop
-- (`quick`) leaves, decided by `decide`, each followed by `quick` again. Its protocol, replies
-- and stored forms are lua/token_bucket.lua's. Loaded last, after lua/token_bucket.lua and
-- what only this form uses (lua/calendar.lua, lua/stored.lua, lua/groups.lua and
-- lua/global.lua): a call whose requests are all plain makes none of their closures, which
-- Redis's Lua would otherwise build on every call.

if not NUM then NUM = setmetatable({}, {__index = num}) end

local PERIOD = {h = true, d = true, w = true, m = true}

-- BORROW[s]: a borrowing bucket's argument
-- 'B<grid>:<want>:<deadline>:<taken>:<unused>:<incarnation>:<rate>' read into its numbers
-- (taken and unused in micro-tokens), or false when malformed. Cold keys of one limit share
-- one argument, read once.
local BORROW = setmetatable({}, {__index = function(memo, s)
  local grid, want, gd, gx, gr, gi, r =
    string.match(s, '^B(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(.+)$')
  local v = false
  if grid and tonumber(r) and tonumber(grid) > 0 then
    v = {grid = tonumber(grid), want = tonumber(want), gd = tonumber(gd),
      gx = tonumber(gx) * 1000000, gr = tonumber(gr) * 1000000, gi = tonumber(gi),
      rate = tonumber(r)}
  end
  memo[s] = v
  return v
end})

-- A borrowing bucket's debt now (see above): reads its groups (`rest`, as read_bucket
-- returns it) into lend.g ({deadline, micro-tokens} pairs) and their incarnation into lend.inc
-- (nil when none is live), ends those whose deadline has passed, applies the slice given back.
-- Sets lend.changed when the groups or the debt must be written whatever the decision.
local NO_GROUPS = {}
local function lent(lend, debt, at, rate, rest)
  lend.rate = rate
  if (not rest or rest == '') and lend.gx == 0 then
    -- Nothing held, nothing given back (a cold key, the common case): a plain bucket.
    lend.g = NO_GROUPS
    if not debt then return 0 end
    return refilled(debt, at, now, rate)
  end
  local g, inc, held = read_groups(rest)
  debt = debt or 0
  at = at or now
  local live = {}
  for _, group in ipairs(g) do
    if group[2] > 0 and group[1] <= now then
      debt = refilled(debt, at, group[1], rate)
      if debt < held then debt = held end
      if group[1] > at + 0 then at = group[1] end
      held = held - group[2]
      lend.changed = true
    elseif group[2] > 0 then
      live[#live + 1] = group
    end
  end
  debt = refilled(debt, at, now, rate)
  if debt < held then debt = held end
  if #live > 0 then lend.inc = inc end
  for _, group in ipairs(live) do
    if group[1] == lend.gd and lend.gx > 0 and lend.gi == inc then
      local taken = math.min(lend.gx, group[2])
      group[2] = group[2] - taken
      debt = debt - math.min(lend.gr, taken)
      if debt < 0 then debt = 0 end
      lend.changed = true
    end
  end
  lend.g = live
  return debt
end

-- After a charge has left `level` micro-tokens, takes a slice: at most half of them in whole
-- tokens and at most lend.want, held in the group ending at (floor(now / grid) + 2) * grid,
-- that group or a free one (a new incarnation when none is under way); none when fewer than
-- two tokens are left or both groups are live with other deadlines. Returns the level after.
local function lend_take(lend, level)
  if level < 2000000 then return level end
  local took = math.min(lend.want, math.floor(level / 2000000))
  if took <= 0 then return level end
  local d = (math.floor(now / lend.grid) + 2) * lend.grid
  local micro = took * 1000000
  if lend.g == NO_GROUPS then lend.g = {} end
  local held
  for _, group in ipairs(lend.g) do
    if group[2] > 0 and group[1] == d then
      held = group
      break
    end
  end
  if not held then
    for _, group in ipairs(lend.g) do
      if group[2] == 0 then held = group end
    end
    if not held and #lend.g < 2 then
      held = {0, 0}
      lend.g[#lend.g + 1] = held
    end
    if not held then return level end
    held[1], held[2] = d, 0
  end
  held[2] = held[2] + micro
  lend.changed = true
  lend.inc = lend.inc or now
  lend.took, lend.d = took, d
  return level - micro
end

-- A borrowing bucket's groups as written after its debt and ts (' <deadline> <micro-tokens>'
-- for each that holds anything, then ' i<incarnation>' when known), and the moment its expiry
-- counts from: the last live deadline (or now).
local function lend_groups(lend)
  if lend.g == NO_GROUPS then return '', now end
  return spell_groups(lend.g, lend.inc, now)
end

-- Decides the n keys KEYS[k+1..k+n] with arguments ARGV[a+1..a+4n]; appends its reply to out.
local function decide(k, a, n)
  local p = #out
  -- out[p+2i+1], out[p+2i+2]: key i's tokens (a number until written) and enough flag.
  out[p + 1], out[p + 2] = '1', ts
  local allowed = '1'
  -- For quota keys only (made at the first one): the period's start and end, and whether
  -- the stored count is this period's.
  local starts, stops, current
  -- For concurrency keys only: the lease each would take, {expiry in µs, id}.
  local leases
  -- Buckets found in an earlier release's form (read_bucket): written now whatever happens.
  local olds
  -- For reserving buckets only: {reservations key, expiry, member, rate}.
  local holds
  -- For borrowing buckets only: their groups and slice (see lent).
  local lends
  -- For global limits' keys only: the region's numbers (lua/global.lua).
  local globals
  for i = 1, n do
    local j = a + 4 * i
    local burst, cost = NUM[ARGV[j - 2]], NUM[ARGV[j - 1]]
    -- Numbers a key cannot carry are refused before this request writes (lua/bounds.lua);
    -- spelled out here rather than called, for Redis's CPU.
    if not (burst and cost and burst >= 1 and burst <= MAX_COUNT and cost >= 0
        and cost <= MAX_COST) then
      refuse(i, 'burst, quota or cost')
    end
    -- The key's level, and one request in its units (micro-tokens for a bucket).
    local level, one
    -- A number: a bucket's rate (a plain bucket, the common case, is decided with one table
    -- lookup here); else a quota's period, a lease or a reservation.
    local rate = NUM[ARGV[j - 3]]
    if not rate and PERIOD[ARGV[j - 3]] then
      if not starts then starts, stops, current = {}, {}, {} end
      local start, stop = period_bounds(ARGV[j - 3], now_s)
      -- pcall: a key this limit wrote while it was a rate limit is a string (WRONGTYPE);
      -- it counts as unused and is replaced when charged.
      local stored = redis.pcall('HMGET', KEYS[k + i], 'used', 'start')
      level, one = burst, 1
      if stored.err then
        current[i] = 'bucket'
      elseif tonumber(stored[2]) == start then
        level = burst - (tonumber(stored[1]) or 0)
        current[i] = true
      end
      starts[i], stops[i] = start, stop
    elseif not rate and string.byte(ARGV[j - 3]) == 71 then
      -- 'G': a global limit's key in a region (lua/global.lua).
      local g = GLOBAL[ARGV[j - 3]]
      if not g then refuse(i, 'global') end
      if not globals then globals = {} end
      local numbers = global_numbers(g, burst, KEYS[k + i])
      globals[i] = numbers
      local debt, at, _, rest = read_bucket(KEYS[k + i], burst)
      if g.lend or (rest and rest ~= '') then
        -- Borrowing, or instances hold tokens of it: its groups read, ended, given back and
        -- kept (lua/global.lua), as a borrowing bucket's.
        local b = g.lend or {grid = 1, want = 0, gd = 0, gx = 0, gr = 0, gi = 0}
        local lend = {grid = b.grid, want = b.want, gd = b.gd, gx = b.gx, gr = b.gr,
          gi = b.gi, reply = g.lend ~= nil}
        if not lends then lends = {} end
        lends[i] = lend
        level = global_lent(numbers, lend, debt, at, rest, now)
      else
        level = global_level(numbers, debt, at, now)
      end
      cost, one = cost * 1000000, 1000000
    elseif not rate and string.byte(ARGV[j - 3]) == 76 then
      -- 'L': a concurrency key.
      local ttl_ms, id = string.match(ARGV[j - 3], '^L(%d+):(%x+)$')
      if not ttl_ms then refuse(i, 'lease') end
      if not leases then leases = {} end
      leases[i] = {string.format('%d', now + ttl_ms * 1000), id}
      redis.call('ZREMRANGEBYSCORE', KEYS[k + i], '-inf', ts)
      level, one = burst - redis.call('ZCARD', KEYS[k + i]), 1
    else
      local back = 0
      local lend
      if not rate and string.byte(ARGV[j - 3]) == 66 then
        -- 'B': a borrowing bucket (its argument read once per call: BORROW).
        local b = BORROW[ARGV[j - 3]]
        if not b then refuse(i, 'borrow') end
        rate = b.rate
        lend = {grid = b.grid, want = b.want, gd = b.gd, gx = b.gx, gr = b.gr, gi = b.gi,
          reply = true}
        if not lends then lends = {} end
        lends[i] = lend
      end
      if not rate then
        -- 'R': a reservation of the cost, held beside the bucket.
        local ttl_ms, id, mode, r = string.match(ARGV[j - 3], '^R(%d+):(%x+):([kr]):(.+)$')
        rate = tonumber(r)
        if not (ttl_ms and rate) then refuse(i, 'reservation') end
        if not holds then holds = {} end
        local rkey = KEYS[k + i] .. ':r'
        -- Kept past its last member: expired ones must still be found for a late settle (and
        -- under 'r', given back while the bucket may still owe them).
        local grace = LATE_GRACE_US
        if mode == 'r' then grace = math.max(grace, math.ceil(burst / rate * 1000000)) end
        holds[i] = {rkey, string.format('%d', now + ttl_ms * 1000), id .. ':' .. ARGV[j - 1], rate, grace}
        back = sweep(rkey, KEYS[k + i] .. ':x', ts, mode == 'r')
      end
      if not (rate > 0 and burst / rate <= MAX_REFILL_S) then refuse(i, 'rate') end
      -- Micro-tokens from here on: level = burst - debt, all integers.
      local debt, at, old, rest = read_bucket(KEYS[k + i], burst)
      if not lend and rest and rest ~= '' then
        -- Tokens of this bucket are held (it borrows): kept, none given back or taken.
        lend = {grid = 1, want = 0, gd = 0, gx = 0, gr = 0}
        if not lends then lends = {} end
        lends[i] = lend
      end
      if lend then
        debt = lent(lend, debt, at, rate, rest)
      elseif not debt then
        debt = 0
      elseif debt > 0 then
        debt = refilled(debt, at, now, rate)
      end
      if back > 0 and debt > 0 then
        -- Expired reservations given back: written whatever this request decides.
        debt = debt - back * 1000000
        if debt < 0 then debt = 0 end
        old = true
      end
      if old then
        if not olds then olds = {} end
        olds[i] = true
      end
      level, cost, one = burst * 1000000 - debt, cost * 1000000, 1000000
    end
    out[p + 2 * i + 1] = level
    -- A cost of 0 (a look) passes while one whole request is left: a refilling bucket holds a
    -- sliver above 0 almost always, which admits nothing.
    if level >= (cost > one and cost or one) then
      out[p + 2 * i + 2] = '1'
    else
      out[p + 2 * i + 2] = '0'
      if ARGV[j] ~= '1' then allowed = '0' end
    end
  end
  out[p + 1] = allowed

  for i = 1, n do
    local j, key = a + 4 * i, KEYS[k + i]
    local level = out[p + 2 * i + 1]
    local cost = NUM[ARGV[j - 1]]
    local charged = allowed == '1' and out[p + 2 * i + 2] == '1' and cost > 0
    if leases and leases[i] then
      if charged then
        level = level - cost
        hold(key, leases[i][1], leases[i][2], 0)
      end
      out[p + 2 * i + 1] = string.format('%.17g', level)
    elseif globals and globals[i] then
      local lend = lends and lends[i]
      if charged then
        level = level - cost * 1000000
        -- A slice, as a borrowing bucket's (below).
        if lend then level = lend_take(lend, level) end
      end
      if lend and (charged or lend.changed) then
        local groups, from = lend_groups(lend)
        global_write(key, globals[i], level, now, ts, groups, from)
      elseif charged then
        global_write(key, globals[i], level, now, ts)
      end
      out[p + 2 * i + 1] = string.format('%d', level)
    elseif starts and starts[i] then
      if charged then level = level - cost end
      if charged and current[i] == true then
        -- This period's count exists, and so does its expiry.
        redis.call('HINCRBY', key, 'used', cost)
      elseif charged then
        if current[i] then redis.call('DEL', key) end
        redis.call('HSET', key, 'used', string.format('%d', cost), 'start', string.format('%d', starts[i]))
        redis.call('PEXPIRE', key, math.ceil((stops[i] * 1000000 - now) / 1000))
      end
      out[p + 2 * i + 1] = string.format('%.17g', level)
    else
      -- In micro-tokens (see above). Only a charge changes the debt: a denial, or a check of
      -- cost 0, writes nothing, so no refill is ever rounded away by a check that took
      -- nothing (the stored debt and its time already say everything).
      if charged then level = level - cost * 1000000 end
      local rate = NUM[ARGV[j - 3]]
      if holds and holds[i] then
        rate = holds[i][4]
        if charged then
          -- Every reservation of a key has the limit's ttl, so this one expires last: no
          -- need to look (hold does, for leases). Should a reload shorten the ttl, an older
          -- reservation goes early: its estimate stays charged, never given back twice.
          redis.call('ZADD', holds[i][1], holds[i][2], holds[i][3])
          redis.call('PEXPIREAT', holds[i][1], expire_at(holds[i][2] + 0, holds[i][5]))
        end
      end
      local lend = lends and lends[i]
      if lend then
        rate = lend.rate
        if charged then level = lend_take(lend, level) end
      end
      if charged or (olds and olds[i]) or (lend and lend.changed) then
        local debt = NUM[ARGV[j - 2]] * 1000000 - level
        local groups, from = '', now
        if lend then groups, from = lend_groups(lend) end
        -- Redis deletes the key in the millisecond after the one in which the bucket is full
        -- again (bounded: see lua/bounds.lua), and never before its last group ends.
        redis.call('SET', key, string.format('v1:%d ', debt) .. ts .. groups, 'PXAT',
          full_at(from, debt, rate))
      end
      out[p + 2 * i + 1] = string.format('%d', level)
    end
  end
  if starts then
    for i = 1, n do
      if starts[i] then
        out[#out + 1] = string.format('%d', stops[i] - now_s)
        out[#out + 1] = string.format('%d', stops[i] - starts[i])
      end
    end
  end
  if lends then
    for i = 1, n do
      if lends[i] and lends[i].reply and lends[i].took then
        out[#out + 1] = string.format('%d', lends[i].took)
        out[#out + 1] = string.format('%d', lends[i].d)
        out[#out + 1] = string.format('%d', lends[i].inc)
      elseif lends[i] and lends[i].reply then
        out[#out + 1] = '0'
        out[#out + 1] = '0'
        out[#out + 1] = '0'
      end
    end
  end
end

if not batch then
  decide(0, 0, #KEYS)
  return table.concat(out, ' ')
end
while a <= last do
  local n = NUM[ARGV[a]]
  if k > 0 then out[#out + 1] = ',' end
  decide(k, a, n)
  k, a = quick(k + n, a + 1 + 4 * n, #out)
end
return table.concat(out, ' ')
