-- Reports to pools of RLQS shares, several pools in one call (each decided on its own): the
-- Rust twin is crates/tollgate-core/src/store/rlqs.rs, which says why each step is there. Arithmetic in the
-- twin's order, so both reach the same integers.
--
-- KEYS[p]  pool p: a hash, holder id -> "demand_milli last_us n_rate (units until_us)*n_rate
--          n_size (units until_us)*n_size" (each dimension a staircase, oldest step first),
--          and the field "escrow" -> "micro_tokens free_rate at_us" (holder ids contain a '.')
-- ARGV     per pool, in the order of KEYS:
--          the reporting holder's id (one Envoy stream's share of the pool);
--          rate units of the pool (tokens per fill interval), its size units (burst);
--          rate and size units kept in reserve; the fill interval (s); how long the new
--          assignment counts (µs); the most holders the pool takes; the holder's member count m (its Envoy buckets), then per
--          member five numbers: 1 if it reported in this message (else 0), its requests
--          allowed and denied since its last report, and the rate, size and expiry (µs on
--          this clock, 0 for none) of what it was last sent
-- Returns  per pool decided (the first ones of KEYS: see HOLDERS_PER_CALL) {rate, size,
--          holders, counted_rate, counted_size, now_us, then per member that reported its
--          rate and size}; rate and size are the holder's, all members'
--          (holders is 0 when the pool was full and the reporter new: it is given nothing)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local MAX_STEPS = 8
local MICRO = 1000000
local TRIP_MARGIN_US = 1000000
local MAX_FILL_US = 1000000000000000
local MAX_REQUESTS = 9000000
local DEMAND_CAP = 4
local MAX_WEIGHT = 1000000
local HOLDERS_PER_CALL = 256

local function decode(text)
  local n = {}
  for part in string.gmatch(text, '[^ ]+') do
    local v = tonumber(part)
    if v == nil or v < 0 or v ~= math.floor(v) then return nil end
    n[#n + 1] = v
  end
  if #n < 4 then return nil end
  local h = {demand = n[1], last = n[2], rate = {}, size = {}}
  local at = 3
  for _, dim in ipairs({'rate', 'size'}) do
    local count = n[at]
    if count == nil or count > MAX_STEPS then return nil end
    at = at + 1
    for k = 1, count do
      if n[at + 1] == nil then return nil end
      h[dim][k] = {n[at], n[at + 1]}
      at = at + 2
    end
  end
  if n[at] ~= nil then return nil end
  return h
end

local function level_at(steps, when)
  for _, step in ipairs(steps) do
    if step[2] > when then return step[1] end
  end
  return 0
end

local function lapsed(h, hold)
  for _, dim in ipairs({'rate', 'size'}) do
    for _, step in ipairs(h[dim]) do
      if step[2] > now then return false end
    end
  end
  return h.last + hold <= now
end

local function push(steps, units, until_us)
  local kept = {}
  for _, step in ipairs(steps) do
    if step[2] > now and step[1] > units then kept[#kept + 1] = step end
  end
  kept[#kept + 1] = {units, until_us}
  if #kept > MAX_STEPS then
    kept[1][2] = kept[2][2]
    table.remove(kept, 2)
  end
  return kept
end

local function encode(h)
  local parts = {string.format('%d %d', h.demand, h.last)}
  for _, dim in ipairs({'rate', 'size'}) do
    parts[#parts + 1] = string.format('%d', #h[dim])
    for _, step in ipairs(h[dim]) do
      parts[#parts + 1] = string.format('%d %d', step[1], step[2])
    end
  end
  return table.concat(parts, ' ')
end

local function size_used(read, when)
  local used = 0
  for _, h in ipairs(read) do used = used + level_at(h.size, when) end
  return used
end

-- The escrow's tokens (millionths) now, refilled since its last update over the pool as it was
-- then: one sweep over the holders' step expiries, each changing one holder's part of the sums.
local function refilled(read, escrow, fresh, rate_units, size_units, fill)
  if escrow == nil then
    if fresh then return math.max(size_units - size_used(read, now), 0) * MICRO end
    return 0
  end
  local at = escrow.at
  local size_of, rate_of, events = {}, {}, {}
  local used, refilling, all_rate = 0, 0, 0
  for i, h in ipairs(read) do
    local s, r = level_at(h.size, at), level_at(h.rate, at)
    size_of[i], rate_of[i] = s, r
    used = used + s
    all_rate = all_rate + r
    if s > 0 then refilling = refilling + r end
    for _, dim in ipairs({'rate', 'size'}) do
      for _, step in ipairs(h[dim]) do
        if step[2] > at and step[2] < now then events[#events + 1] = {step[2], i} end
      end
    end
  end
  table.sort(events, function(a, b) return a[1] < b[1] end)
  local ceiling = math.min(escrow.free + all_rate, rate_units)
  local tokens = escrow.micro
  local k = 1
  while true do
    local tau = now
    if k <= #events then tau = events[k][1] end
    local free = math.max(ceiling - refilling, 0)
    local refill = math.floor(free * math.max(tau - at, 0) / math.max(fill, 1))
    tokens = math.min(tokens + refill, math.max(size_units - used, 0) * MICRO)
    at = tau
    if k > #events then break end
    while k <= #events and events[k][1] == tau do
      local i = events[k][2]
      local h = read[i]
      local s, r = level_at(h.size, tau), level_at(h.rate, tau)
      used = used - size_of[i] + s
      if size_of[i] > 0 then refilling = refilling - rate_of[i] end
      if s > 0 then refilling = refilling + r end
      size_of[i], rate_of[i] = s, r
      k = k + 1
    end
  end
  return math.min(tokens, math.max(size_units - size_used(read, now), 0) * MICRO)
end

-- `budget` split by `weights` (each at least 1): one unit each, then the spare in proportion;
-- with fewer units than weights, one unit each to the heaviest (ties: the first). The running
-- sum is held to the budget, whatever a quotient rounded to.
local function split(budget, weights)
  local k = #weights
  local out = {}
  if budget >= k then
    local total = 0
    for i = 1, k do total = total + weights[i] end
    local spare, given = budget - k, 0
    for i = 1, k do
      out[i] = math.min(1 + math.floor(spare * weights[i] / total), budget - given)
      given = given + out[i]
    end
  else
    local order = {}
    for i = 1, k do order[i] = i; out[i] = 0 end
    table.sort(order, function(a, b)
      if weights[a] ~= weights[b] then return weights[a] > weights[b] end
      return a < b
    end)
    for j = 1, budget do out[order[j]] = 1 end
  end
  return out
end

local function decide(key, at)
  local me = ARGV[at]
  local rate_units = tonumber(ARGV[at + 1])
  local size_units = tonumber(ARGV[at + 2])
  local reserve_rate = tonumber(ARGV[at + 3])
  local reserve_size = tonumber(ARGV[at + 4])
  local fill = tonumber(ARGV[at + 5])
  local hold = tonumber(ARGV[at + 6])
  local max_holders = tonumber(ARGV[at + 7])
  local count = tonumber(ARGV[at + 8])
  at = at + 9
  local members, requests = {}, 0
  for i = 1, count do
    local m = {
      present = ARGV[at] == '1',
      requests = math.min(tonumber(ARGV[at + 1]), MAX_REQUESTS),
      rate = tonumber(ARGV[at + 2]),
      size = tonumber(ARGV[at + 3]),
      until_us = tonumber(ARGV[at + 4]),
    }
    if m.present then requests = requests + m.requests end
    members[i] = m
    at = at + 5
  end
  requests = math.min(requests, MAX_REQUESTS)

  local flat = redis.call('HGETALL', key)
  local fresh = #flat == 0
  local ids, holders, previous, escrow, read, gone = {}, {}, nil, nil, {}, {}
  for i = 1, #flat, 2 do
    local id, h = flat[i], nil
    if id ~= 'escrow' then h = decode(flat[i + 1]) end
    if h then read[#read + 1] = h end
    if id == 'escrow' then
      local e = {}
      for part in string.gmatch(flat[i + 1], '[^ ]+') do e[#e + 1] = tonumber(part) end
      if #e == 3 and e[1] and e[2] and e[3] then
        escrow = {micro = e[1], free = e[2], at = e[3]}
        fresh = false
      end
    elseif id == me then
      previous = h
    elseif h == nil or lapsed(h, hold) then
      gone[#gone + 1] = id
    else
      ids[#ids + 1] = id
      holders[id] = h
    end
  end

  -- A full pool takes no newcomer: every report costs a pass over the holders, so their
  -- number bounds a call. The newcomer is answered nothing (holders 0) and the pool is left
  -- as it was, lapsed holders included (the escrow's refill still counts them).
  if previous == nil and #ids >= max_holders then
    local used_rate, used_size = 0, 0
    for _, id in ipairs(ids) do
      used_rate = used_rate + level_at(holders[id].rate, now)
      used_size = used_size + level_at(holders[id].size, now)
    end
    local reply = {0, 0, 0, used_rate, used_size, now}
    for _, m in ipairs(members) do
      if m.present then reply[#reply + 1] = 0; reply[#reply + 1] = 0 end
    end
    return reply, at
  end
  for _, id in ipairs(gone) do redis.call('HDEL', key, id) end

  -- Demand in milli-requests per second on this clock; a newcomer's is the others' mean. No
  -- holder's counts for more than four times the pool's rate.
  local demand
  if previous and now > previous.last then
    local elapsed_ms = math.max(math.floor((now - previous.last) / 1000), 1)
    demand = math.floor(requests * 1000000 / elapsed_ms)
  elseif previous then
    demand = previous.demand
  else
    demand = math.floor(requests * 1000000 / 5000)
    if #ids > 0 then
      local sum = 0
      for _, id in ipairs(ids) do sum = sum + holders[id].demand end
      demand = math.max(demand, math.floor(sum / #ids))
    end
  end
  demand = math.min(demand, math.floor(DEMAND_CAP * 1000 * rate_units / math.max(fill, 1)))

  local used_rate, used_size = 0, 0
  for _, id in ipairs(ids) do
    used_rate = used_rate + level_at(holders[id].rate, now)
    used_size = used_size + level_at(holders[id].size, now)
  end

  local mine = previous or {demand = 0, last = 0, rate = {}, size = {}}
  mine.demand = demand
  mine.last = now
  ids[#ids + 1] = me
  holders[me] = mine
  table.sort(ids)
  local who
  local demands = {}
  for i, id in ipairs(ids) do
    if id == me then who = i end
    demands[i] = holders[id].demand
  end

  local rate_budget = math.max(rate_units - reserve_rate, 0)
  local size_budget = math.max(size_units - reserve_size, 0)
  local n = #ids
  local eligible = {}
  local slots = math.min(rate_budget, size_budget)
  if n <= slots then
    for i = 1, n do eligible[i] = true end
  else
    local order = {}
    for i = 1, n do order[i] = i; eligible[i] = false end
    table.sort(order, function(a, b)
      if demands[a] ~= demands[b] then return demands[a] > demands[b] end
      return a < b
    end)
    for k = 1, slots do eligible[order[k]] = true end
  end

  local scale = fill / 1000
  local rate_demands = {}
  for i = 1, n do rate_demands[i] = demands[i] * scale end

  -- Every holder's rate target in one pass: one unit each, then the spare in proportion to
  -- demand, capped at demand plus a quarter with what is left split evenly.
  local targets = {}
  do
    local chosen, total = 0, 0
    for j = 1, n do
      if eligible[j] then chosen = chosen + 1; total = total + rate_demands[j] end
    end
    local spare = math.max(rate_budget - chosen, 0)
    for j = 1, n do
      if not eligible[j] then
        targets[j] = 0
      else
        local extra
        if total * 1.25 >= spare then
          if total > 0 then extra = math.floor(spare * rate_demands[j] / total) else extra = 0 end
        else
          extra = math.floor(rate_demands[j] * 1.25 + (spare - total * 1.25) / chosen)
        end
        targets[j] = 1 + extra
      end
    end
  end

  -- Sizes follow the rate targets: the same rule, weighted by them.
  local rate = targets[who]
  local size = 0
  if rate > 0 then
    local chosen, total = 0, 0
    for j = 1, n do
      if eligible[j] then chosen = chosen + 1; total = total + targets[j] end
    end
    local spare = math.max(size_budget - chosen, 0)
    local extra = 0
    if total > 0 then extra = math.floor(spare * targets[who] / total) end
    size = 1 + extra
  end
  local held_rate, held_size = level_at(mine.rate, now), level_at(mine.size, now)
  local free_rate = math.max(rate_units - used_rate, held_rate)
  local free_size = math.max(size_units - used_size, held_size)
  -- A newcomer beside others takes at most half of what is free (at least one unit).
  if previous == nil and #ids > 1 then
    free_rate = math.max(math.floor(free_rate / 2), math.min(free_rate, 1))
    free_size = math.max(math.floor(free_size / 2), math.min(free_size, 1))
  end
  local grant_rate = math.min(rate, free_rate)
  local grant_size = math.min(size, free_size)

  local tokens = refilled(read, escrow, fresh, rate_units, size_units, fill)

  -- The holder's grant split among the members that reported; the others keep what they
  -- were sent. A member's growth past the size it surely still applies takes its tokens from
  -- the escrow (Envoy keeps a changed bucket's fill fraction and starts a first one full).
  local absent_rate, absent_size = 0, 0
  local reported, weights = {}, {}
  for _, m in ipairs(members) do
    if m.present then
      reported[#reported + 1] = m
      weights[#weights + 1] = math.min(m.requests, MAX_WEIGHT - 1) + 1
    elseif m.until_us > now then
      absent_rate = absent_rate + m.rate
      absent_size = absent_size + m.size
    end
  end
  local rates = split(math.max(grant_rate - absent_rate, 0), weights)
  local sizes = split(math.max(grant_size - absent_size, 0), weights)
  local total_rate, total_size = absent_rate, absent_size
  local answers = {}
  for i, m in ipairs(reported) do
    local r, s, last = rates[i], sizes[i], 0
    -- Envoy surely still applies it when this answer arrives (TTL + 1 s margin from sending,
    -- Envoy's TTL from receipt, the answer's trip at most the margin): else it may start full.
    if m.until_us > now + 2 * TRIP_MARGIN_US then last = m.size end
    if s > last then s = math.min(s, last + math.floor(tokens / MICRO)) end
    if r == 0 or s == 0 then r = 0; s = 0 end
    tokens = tokens - math.max(s - last, 0) * MICRO
    total_rate = total_rate + r
    total_size = total_size + s
    answers[#answers + 1] = r
    answers[#answers + 1] = s
  end

  -- The assignments it replaces keep counting until their own expiry.
  mine.rate = push(mine.rate, total_rate, now + hold)
  mine.size = push(mine.size, total_size, now + hold)
  local mine_rate, mine_size = level_at(mine.rate, now), level_at(mine.size, now)

  redis.call('HSET', key, me, encode(mine))
  local last = now + hold
  for _, id in ipairs(ids) do
    local h = holders[id]
    for _, dim in ipairs({'rate', 'size'}) do
      for _, step in ipairs(h[dim]) do last = math.max(last, step[2]) end
    end
    last = math.max(last, h.last + hold)
  end
  local free_after = math.max(rate_units - used_rate - mine_rate, 0)
  redis.call('HSET', key, 'escrow', string.format('%d %d %d', tokens, free_after, now))
  local missing = math.max(size_units * MICRO - tokens, 0)
  last = last + math.min(math.ceil(missing * math.max(fill, 1) / math.max(rate_units, 1)), MAX_FILL_US)
  redis.call('PEXPIREAT', key, math.floor(last / 1000) + 1)
  local reply = {total_rate, total_size, n, used_rate + mine_rate, used_size + mine_size, now}
  for _, v in ipairs(answers) do reply[#reply + 1] = v end
  return reply, at
end

-- Pools are decided in order until the next would take the call past HOLDERS_PER_CALL
-- holders read (the first is always decided): one call stays short whatever the pools hold,
-- and the caller sends the pools left unanswered again.
local replies, at, read = {}, 1, 0
for p = 1, #KEYS do
  local fields = redis.call('HLEN', KEYS[p])
  if p > 1 and read + fields > HOLDERS_PER_CALL then break end
  read = read + fields
  replies[p], at = decide(KEYS[p], at)
end
return replies
