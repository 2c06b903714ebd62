-- One holder's report in a pool of RLQS shares: the Rust twin is src/store/shares.rs, which
-- says why each step is there. Arithmetic in the twin's order, so both reach the same integers.
--
-- KEYS[1]  the pool: a hash, holder id -> "demand_milli last_us n_rate (units until_us)*n_rate
--          n_size (units until_us)*n_size" (each dimension a staircase, oldest step first),
--          and the field "escrow" -> "micro_tokens free_rate at_us" (holder ids contain a '.')
-- ARGV[1]  the reporting holder's id
-- ARGV[2]  requests it allowed and denied since its last report
-- ARGV[3]  rate units of the pool (tokens per fill interval), ARGV[4] its size units (burst)
-- ARGV[5]  rate units kept in reserve, ARGV[6] size units kept in reserve
-- ARGV[7]  the fill interval (s), ARGV[8] how long the new assignment counts (µs)
-- Returns  {rate, size, holders, counted_rate, counted_size}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local me = ARGV[1]
local requests = math.min(tonumber(ARGV[2]) or 0, 9000000)
local rate_units = tonumber(ARGV[3])
local size_units = tonumber(ARGV[4])
local reserve_rate = tonumber(ARGV[5])
local reserve_size = tonumber(ARGV[6])
local fill = tonumber(ARGV[7])
local hold = tonumber(ARGV[8])

local MAX_STEPS = 8
local MICRO = 1000000
local TRIP_MARGIN_US = 1000000
local MAX_FILL_US = 1000000000000000

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

local function level(steps)
  for _, step in ipairs(steps) do
    if step[2] > now then return step[1] end
  end
  return 0
end

local function level_at(steps, t)
  for _, step in ipairs(steps) do
    if step[2] > t then return step[1] end
  end
  return 0
end

local function counted(h)
  return level(h.rate), level(h.size)
end

local function lapsed(h)
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

local flat = redis.call('HGETALL', KEYS[1])
local fresh = #flat == 0
local ids, holders, previous, escrow, read = {}, {}, nil, nil, {}
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
  elseif h == nil or lapsed(h) then
    redis.call('HDEL', KEYS[1], id)
  else
    ids[#ids + 1] = id
    holders[id] = h
  end
end

-- Demand in milli-requests per second on this clock; a newcomer's is the others' mean.
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

local used_rate, used_size = 0, 0
for _, id in ipairs(ids) do
  local r, s = counted(holders[id])
  used_rate = used_rate + r
  used_size = used_size + s
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
  local count, total = 0, 0
  for j = 1, n do
    if eligible[j] then count = count + 1; total = total + rate_demands[j] end
  end
  local spare = math.max(rate_budget - count, 0)
  for j = 1, n do
    if not eligible[j] then
      targets[j] = 0
    else
      local extra
      if total * 1.25 >= spare then
        if total > 0 then extra = math.floor(spare * rate_demands[j] / total) else extra = 0 end
      else
        extra = math.floor(rate_demands[j] * 1.25 + (spare - total * 1.25) / count)
      end
      targets[j] = 1 + extra
    end
  end
end

-- Sizes follow the rate targets: the same rule, weighted by them.
local rate = targets[who]
local size = 0
if rate > 0 then
  local count, total = 0, 0
  for j = 1, n do
    if eligible[j] then count = count + 1; total = total + targets[j] end
  end
  local spare = math.max(size_budget - count, 0)
  local extra = 0
  if total > 0 then extra = math.floor(spare * targets[who] / total) end
  size = 1 + extra
end
local held_rate, held_size = counted(mine)
local free_rate = math.max(rate_units - used_rate, held_rate)
local free_size = math.max(size_units - used_size, held_size)
-- A newcomer beside others takes at most half of what is free (at least one unit).
if previous == nil and #ids > 1 then
  free_rate = math.max(math.floor(free_rate / 2), math.min(free_rate, 1))
  free_size = math.max(math.floor(free_size / 2), math.min(free_size, 1))
end
local grant_rate = math.min(rate, free_rate)
local grant_size = math.min(size, free_size)

-- The escrow, refilled since its last update over the pool as it was then: each stretch
-- between two step expiries adds the rate no Envoy can be refilling then (the pool's rate,
-- the smaller of now's and the stored one's, less the counted rates of holders whose counted
-- size is above 0), capped at that stretch's free size.
local function cap_at(t)
  local used = 0
  for _, h in ipairs(read) do used = used + level_at(h.size, t) end
  return math.max(size_units - used, 0) * MICRO
end
local function rate_at(t, refilling_only)
  local sum = 0
  for _, h in ipairs(read) do
    if not refilling_only or level_at(h.size, t) > 0 then sum = sum + level_at(h.rate, t) end
  end
  return sum
end
local tokens
if escrow then
  local times, seen = {}, {}
  for _, h in ipairs(read) do
    for _, dim in ipairs({'rate', 'size'}) do
      for _, step in ipairs(h[dim]) do
        local u = step[2]
        if u > escrow.at and u < now and not seen[u] then
          seen[u] = true
          times[#times + 1] = u
        end
      end
    end
  end
  table.sort(times)
  times[#times + 1] = now
  local ceiling = math.min(escrow.free + rate_at(escrow.at, false), rate_units)
  tokens = escrow.micro
  local t = escrow.at
  for _, tau in ipairs(times) do
    local free = math.max(ceiling - rate_at(t, true), 0)
    local refill = math.floor(free * math.max(tau - t, 0) / math.max(fill, 1))
    tokens = math.min(tokens + refill, cap_at(t))
    t = tau
  end
  tokens = math.min(tokens, cap_at(now))
elseif fresh then
  tokens = cap_at(now)
else
  tokens = 0
end
-- A growth past the size last sent needs its tokens from the escrow.
local last_sent = 0
local newest = mine.size[#mine.size]
-- Envoy surely still applies it when this answer arrives (TTL + 1 s margin from sending,
-- Envoy's TTL from receipt, the answer's trip at most the margin): else it may start full.
if newest and newest[2] > now + 2 * TRIP_MARGIN_US then last_sent = newest[1] end
if grant_size > last_sent then
  grant_size = math.min(grant_size, last_sent + math.floor(tokens / MICRO))
end
if grant_rate == 0 or grant_size == 0 then grant_rate = 0; grant_size = 0 end
tokens = tokens - math.max(grant_size - last_sent, 0) * MICRO

-- The assignments it replaces keep counting until their own expiry.
mine.rate = push(mine.rate, grant_rate, now + hold)
mine.size = push(mine.size, grant_size, now + hold)
local mine_rate, mine_size = counted(mine)

redis.call('HSET', KEYS[1], me, encode(mine))
local last = now + hold
for _, id in ipairs(ids) do
  local h = holders[id]
  for _, dim in ipairs({'rate', 'size'}) do
    for _, step in ipairs(h[dim]) do last = math.max(last, step[2]) end
  end
  last = math.max(last, h.last + hold)
end
local free_after = math.max(rate_units - used_rate - mine_rate, 0)
redis.call('HSET', KEYS[1], 'escrow', string.format('%d %d %d', tokens, free_after, now))
local missing = math.max(size_units * MICRO - tokens, 0)
last = last + math.min(math.ceil(missing * math.max(fill, 1) / math.max(rate_units, 1)), MAX_FILL_US)
redis.call('PEXPIREAT', KEYS[1], math.floor(last / 1000) + 1)
return {grant_rate, grant_size, n, used_rate + mine_rate, used_size + mine_size}
