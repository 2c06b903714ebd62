-- tollgate token bucket and calendar quota: decides N keys all-or-nothing in one atomic call,
-- or several such requests in turn (a batch). Loaded after lua/bounds.lua (its bounds and
-- refuse); its plain checks are decided here, and every other request by lua/decide.lua, loaded
-- after lua/calendar.lua (period_bounds), lua/stored.lua (the stored forms), lua/groups.lua (a
-- borrowing bucket's held groups) and lua/global.lua (global limits) behind it.
--
-- One request:
-- KEYS[i]     key i: a bucket, the string "v1:<debt> <ts>" (lua/stored.lua: how far it is below
--             full, in micro-tokens, as of ts in microseconds of this server's TIME; absent
--             when full), or a quota, hash {used, start} (start: the Unix second its period
--             began)
--             or a concurrency key, a sorted set of lease ids scored by their expiry (µs of TIME)
-- ARGV[4i-3]  a bucket's rate, tokens per second (> 0, may be fractional); or a quota's period:
--             'h' hour, 'd' day, 'w' ISO week (from Monday), 'm' calendar month (UTC); or a
--             lease to take, 'L<ttl in ms>:<lease id in hex>'; or a bucket whose charge is held
--             as a reservation, 'R<ttl in ms>:<id in hex>:<k|r>:<rate>' (below); or a
--             borrowing bucket, 'B<grid µs>:<want>:<deadline>:<taken>:<unused>:<incarnation>:<rate>'
--             (below); or a global limit's key in a region, 'G<floor in millionths>:<rate>',
--             or borrowing, 'G<floor in millionths>:<grid µs>:<want>:<deadline>:<taken>:
--             <unused>:<incarnation>:<rate>' (lua/global.lua, loaded in front: its level is
--             read and written there, its groups as a borrowing bucket's)
-- ARGV[4i-2]  a bucket's burst: its capacity (>= 1); or the quota: at most this per period;
--             or the most leases held at once
-- ARGV[4i-1]  cost to charge key i (>= 0; 0 asks only that the key is not used up: a
--             charge = "report" limit, charged later by lua/report.lua)
-- ARGV[4i]    "1" if key i is a shadow limit: reported, never denies
--
-- Returns one string, "allowed now tokens_1 enough_1 ... tokens_n enough_n t_q1 w_q1 ...",
-- space-separated:
--   allowed   1 when every non-shadow key holds its cost; only then is anything charged
--             (each key that can pay, shadow ones included)
--   now       this call's TIME in microseconds: the `ts` it wrote. On a Redis Cluster, a
--             request whose keys span slots is decided per slot, and a charge that must be
--             undone is refunded by lua/refund.lua, which needs this moment.
--   tokens_i  what key i holds after this call: a bucket, burst - debt in micro-tokens (an
--             integer); a quota: what is left of it; a concurrency key: its free slots
--   enough_i  1 when key i held its cost (a cost of 0: one whole request)
--   t_q, w_q  for each quota key, in KEYS order: seconds until its period ends, and the
--             period's length in seconds
--   s_b, d_b, i_b  then for each borrowing key (a global one's too), in KEYS order: the whole tokens it took beyond
--             its cost, the deadline (µs of TIME) of the group holding them and the groups'
--             incarnation (0 0 0: none)
--
-- A batch (ARGV[1] is "*", which no rate or period is): requests one after another, KEYS
-- holding every request's keys in order and ARGV, after the "*", for each request its key
-- count n and then its 4n arguments as above. Each request is decided as if alone, in order,
-- all at the same TIME: a request sees what the ones before it charged, so two requests for
-- one bucket in one batch are decided exactly as two calls would be. Returns the requests'
-- replies, as above, joined by " , ". One call for many requests costs Redis one TIME, one
-- script invocation and one reply instead of one of each per request.
--
-- Numbers outside what a bucket can carry (lua/bounds.lua) are refused with an error naming
-- the key, before this request writes anything.
--
-- The clock is Redis's own (TIME), never the caller's, so instances with skewed clocks agree.
-- A bucket's numbers apply to its debt: a raised burst grants the difference at once, a
-- lowered one binds at the next check. A charge writes "v1:<debt> <now>" with SET ... PXAT at the
-- millisecond after the bucket is full again (so never before): an absent bucket reads as
-- full, so that changes no decision and keeps only the buckets that matter; a bucket in debt
-- (charged by reports) lives until it has refilled its debt too. A denial writes nothing: the
-- debt and its time are unchanged by it. The refill since ts lowers the debt by whole
-- micro-tokens, rounded down: at most one micro-token per charge is never given back. A quota is written only when charged and
-- expires when its period ends; a count from an earlier period is void.
-- A concurrency key drops its expired leases (expiry <= now) before counting them; its level
-- is the free slots; a taken lease is added with expiry now + ttl, and the key expires with
-- its last lease.
-- A reserving bucket keeps its reservations beside it, in KEYS[i] .. ':r' (same hash tag, so
-- the same Cluster slot): members '<id>:<estimate>' scored by expiry (lua/stored.lua: hold,
-- sweep). The bucket is charged the estimate (the cost) as any bucket; when it is, the
-- reservation is added, expiring now + ttl, for lua/settle.lua to settle. Expired ones are
-- moved first to KEYS[i] .. ':x', where a late settle still finds them; under 'r' their
-- estimates are given back to the debt before the decision (the set outlives its last
-- reservation by a day, or the burst's refill time if longer, so they are found).
--
-- A borrowing bucket ('B', docs/DESIGN.md "Borrowed tokens") keeps the tokens instances hold
-- in its own value, after the debt and ts: at most two groups "<deadline> <micro-tokens>",
-- deadlines on a grid of <grid> µs, then " i<incarnation>": TIME (µs) when a group was taken
-- while none was live, which names this life of the groups. Any check of a bucket that carries
-- groups reads and keeps them (a plain rate argument then gives nothing back and takes
-- nothing). The held tokens are part of the debt but do not refill:
-- the debt reads as max(held, refilled debt). A group whose deadline has passed ends (in
-- deadline order, the debt refilled up to it first): its tokens count as used from then on.
-- First the slice named by <deadline> and <incarnation> is given back, whatever this request
-- decides: its group loses <taken> tokens, the debt <unused> of them (nothing when that group
-- has ended, or when the groups are another incarnation: the bucket was deleted since, by
-- FLUSHALL or DEL, and held again, so the group of that deadline is another slice's; nothing
-- either when the value names no incarnation, written by an earlier build). Then,
-- when the key is charged, it takes min(<want>, half of what is left after its cost) whole
-- tokens more into the group ending at (floor(now / grid) + 2) * grid (none when fewer than
-- two are left, or when both groups are live with other deadlines). The bucket is written
-- when charged, given back, taken from or a group ended; its expiry counts the whole debt as
-- refilling from the last live deadline.
--
-- Written for Redis's CPU, which every check of a fleet shares: one string reply (an array
-- costs Redis a deferred-length reply block), integers only, printed with '%d' (a float
-- format costs several times more), one GET and one SET per bucket, `ts` spelled from TIME's
-- own digits, and each distinct argument read as a number once per call (NUM below: the
-- requests of a batch repeat the same few rates and bursts, and strtod was a sixth of the
-- script's work). Plain buckets, most of the checks, are decided first, before the closures
-- and tables the other forms need are made (below: Redis's Lua collector works for every byte
-- a call allocates), and a string spelled for one of a batch's requests is reused by the next
-- that would spell the same.

local KEYS, ARGV = KEYS, ARGV
local t = redis.call('TIME')
local now_s = t[1] + 0
local now = now_s * 1000000 + t[2]
local us = t[2]
if #us < 6 then us = string.rep('0', 6 - #us) .. us end
local ts = t[1] .. us

-- NUM[s]: the argument s as a number, or false when it is not one ('h', 'L...', 'R...').
-- Made for a batch (its requests repeat the same few numbers), and for decide.
local function num(memo, s)
  local v = tonumber(s) or false
  memo[s] = v
  return v
end
local batch = ARGV[1] == '*'
local NUM
if batch then NUM = setmetatable({}, {__index = num}) end

-- The reply, field by field: every request's fields, requests separated by a "," field.
local out = {}

-- Plain buckets first: a request of one key with a number for its rate, the common case (a
-- batch's are mostly these), is decided by `quick`, before any of the machinery below is
-- made: no closure, table or metatable of the general path is built for a call that needs
-- none, and Lua's collector, which Redis runs for every byte a call allocates, has that much
-- less to do. So is a borrowing bucket's request ('B') whose key holds no group and which gives
-- nothing back: a cold key's first take, the most common borrowing request, is a plain bucket
-- that may take a slice. It is decide's arithmetic (and lent's, lend_take's and
-- lend_groups' for a key holding nothing), operation for operation, so the same decision, the
-- same bytes written and the same reply. A request that is not one of these, or whose key
-- holds anything but "v1:<debt> <ts>" or nothing (held groups, garbage, a value without the
-- marker or of another format, the 0.1.0 release's hash), stops `quick` before it writes or
-- replies anything for it (it has only read the key); decide takes that request, and `quick`
-- the ones after it. A request's reply is one field, "allowed now tokens enough" (and "took
-- deadline incarnation" for a borrowing one): joined with ' ', the same text as decide's.
local k, a, last = 0, 0, 0
if batch then a, last = 2, #ARGV end
-- The last SET value, expiry and reply spelled, with what they spell: the requests of a batch
-- often charge the same cost to cold keys of one limit, all at the same TIME, so the next one
-- reuses them rather than format them again. The same for the last borrowing argument read:
-- cold keys of one limit share it.
local last_debt, last_value, last_at, last_pxat
local last_level, last_allowed, last_enough, last_reply
local last_borrow, borrow_grid, borrow_want, borrow_rate
local call_redis, pcall_redis, format = redis.call, redis.pcall, string.format

-- Decides the requests from key k + 1 and argument a + 1 on (out holding p fields) while they
-- are plain; returns where it stopped and out's length.
local function quick(k, a, p)
  while a <= last do
    local n
    if batch then n = NUM[ARGV[a]] else n = #KEYS end
    if n ~= 1 then break end
    local rate, burst, cost
    if batch then
      rate, burst, cost = NUM[ARGV[a + 1]], NUM[ARGV[a + 2]], NUM[ARGV[a + 3]]
    else
      -- Each argument is read once: NUM's memo would only cost.
      rate, burst, cost = tonumber(ARGV[1]) or false, tonumber(ARGV[2]) or false,
        tonumber(ARGV[3]) or false
    end
    -- A borrowing bucket's grid and want (nil: a plain bucket).
    local grid, want
    if not rate then
      local arg = ARGV[a + 1]
      if arg ~= last_borrow then
        -- 'B<grid>:<want>:<deadline>:<taken>:<unused>:<incarnation>:<rate>', taking nothing
        -- back (taken 0): anything else is decide's.
        local g, w, r = string.match(arg, '^B(%d+):(%d+):%d+:0:%d+:%d+:(.+)$')
        g, w, r = tonumber(g), tonumber(w), tonumber(r)
        if not (g and w and r and g > 0) then break end
        last_borrow, borrow_grid, borrow_want, borrow_rate = arg, g, w, r
      end
      grid, want, rate = borrow_grid, borrow_want, borrow_rate
    end
    if not (burst and cost and burst >= 1 and burst <= MAX_COUNT and cost >= 0
        and cost <= MAX_COST) then
      refuse(1, 'burst, quota or cost')
    end
    if not (rate > 0 and burst / rate <= MAX_REFILL_S) then refuse(1, 'rate') end
    local key = KEYS[k + 1]
    -- pcall: an earlier release's hash (WRONGTYPE) is decide's to convert (read_bucket).
    local stored = pcall_redis('GET', key)
    local debt = 0
    if stored then
      if type(stored) ~= 'string' then break end
      local d, at = string.match(stored, '^v1:(%d+) (%d+)$')
      d = tonumber(d)
      if not (d and d <= MAX_DEBT_UT) then break end
      debt = d
      if debt > 0 then
        -- refilled(debt, at, now, rate), spelled out.
        local elapsed = now - at
        if elapsed > 0 then
          debt = debt - math.floor(elapsed * rate)
          if debt < 0 then debt = 0 end
        end
      end
    end
    local level, c = burst * 1000000 - debt, cost * 1000000
    local allowed, enough = '1', '1'
    -- A borrowing request's slice: the whole tokens taken and the deadline of their group.
    local took, deadline = 0, now
    if level >= (c > 1000000 and c or 1000000) then
      if cost > 0 then
        level = level - c
        if grid and want > 0 and level >= 2000000 then
          -- lend_take into no group: at most half of what is left, in a new incarnation.
          took = math.min(want, math.floor(level / 2000000))
          deadline = (math.floor(now / grid) + 2) * grid
          level = level - took * 1000000
        end
        debt = burst * 1000000 - level
        -- full_at(deadline, debt, rate), spelled out: a slice's group counts from its end.
        local ttl = math.ceil(debt / rate)
        if not (ttl <= MAX_TTL_US) then ttl = MAX_TTL_US end
        if ttl < 0 then ttl = 0 end
        local at_ms = (deadline + ttl) / 1000
        at_ms = at_ms - at_ms % 1 + 1
        if at_ms ~= last_at then last_at, last_pxat = at_ms, format('%d', at_ms) end
        if took > 0 then
          call_redis('SET', key, format('v1:%d ', debt) .. ts
            .. format(' %d %d i', deadline, took * 1000000) .. ts, 'PXAT', last_pxat)
        else
          if debt ~= last_debt then
            last_debt, last_value = debt, format('v1:%d ', debt) .. ts
          end
          call_redis('SET', key, last_value, 'PXAT', last_pxat)
        end
      end
    else
      enough = '0'
      if ARGV[a + 4] ~= '1' then allowed = '0' end
    end
    if level ~= last_level or allowed ~= last_allowed or enough ~= last_enough then
      last_level, last_allowed, last_enough = level, allowed, enough
      last_reply = allowed .. ' ' .. ts .. ' ' .. format('%d', level) .. ' ' .. enough
    end
    if k > 0 then
      p = p + 1
      out[p] = ','
    end
    p = p + 1
    if took > 0 then
      out[p] = last_reply .. format(' %d %d ', took, deadline) .. ts
    elseif grid then
      out[p] = last_reply .. ' 0 0 0'
    else
      out[p] = last_reply
    end
    k, a = k + 1, a + 5
  end
  return k, a, p
end

k, a = quick(k, a, 0)
if a > last then
  if batch then return table.concat(out, ' ') end
  return out[1]
end
