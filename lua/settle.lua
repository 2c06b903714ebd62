-- tollgate settle: replaces a reservation's estimate by the request's actual cost (POST /report
-- with a reservation id), once. Prefixed with lua/bounds.lua and lua/stored.lua when loaded.
--
-- KEYS[1]  the bucket, as lua/token_bucket.lua keeps it
-- KEYS[2]  its reservations (KEYS[1] .. ':r'): members '<id>:<estimate>' scored by expiry
-- KEYS[3]  its expired reservations (KEYS[1] .. ':x'), as lua/stored.lua's sweep moves them:
--          members '<id>:<estimate>:<r|k>', the flag saying what the expiry did
-- ARGV[1]  the bucket's rate, tokens per second
-- ARGV[2]  its burst
-- ARGV[3]  the actual cost
-- ARGV[4]  its max_debt: a further charge stops at -max_debt
-- ARGV[5]  the reservation, '<id>:<estimate>'
-- ARGV[6]  'r' when expired reservations give their estimates back, 'k' when they keep them
--          (what this call's sweep does to those expiring now)
--
-- Returns "held tokens": held 1 when the reservation is settled by this call, 0 when it was
-- settled before or is unknown (then nothing changes for it: a retried settle never charges
-- twice); tokens, what the bucket holds afterwards (%.6f).
--
-- A held reservation is settled as its check charged it: the difference given back, or
-- charged into debt. An expired one (the request outlived the ttl) is settled late, once, while
-- lua/stored.lua keeps it, as its expiry left it (its flag, not ARGV[6]: the mode may have
-- changed since, by a reload or on another instance): kept ('k'), the difference applies as
-- above; given back ('r'), the whole actual cost is charged. Either way the bucket ends as if
-- the request had cost `actual` (down to -max_debt at most), never given back more than its
-- check charged. A member without a flag (moved there by an earlier release, which did not
-- record what it did) settles as given back: the whole actual cost, nothing returned. That can
-- charge a kept estimate and the actual cost both, once, but never gives an estimate back
-- twice. Expired reservations are moved on the way, as a check moves them.

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local actual, max_debt = tonumber(ARGV[3]), tonumber(ARGV[4])
check_bucket(1, rate, burst, actual, max_debt)
local estimate = tonumber(string.match(ARGV[5], '^%x+:(%d+)$'))
if not (estimate and estimate <= MAX_COST) then refuse(1, 'reservation') end

local refund = ARGV[6] == 'r'
local back = sweep(KEYS[2], KEYS[3], string.format('%d', now), refund)
local held = redis.call('ZREM', KEYS[2], ARGV[5])
if held == 0 then
  held = redis.call('ZREM', KEYS[3], ARGV[5] .. ':k')
  if held == 0 then
    -- Its estimate was given back at expiry (or, unflagged, may have been).
    held = math.min(1, redis.call('ZREM', KEYS[3], ARGV[5] .. ':r', ARGV[5]))
    estimate = 0
  end
end
if held == 1 and actual < estimate then back = back + estimate - actual end

local debt, at, old = read_bucket(KEYS[1], burst)
if debt == nil then
  debt = 0
else
  debt = refilled(debt, at, now, rate)
end
local before = debt
-- Micro-tokens (lua/stored.lua): given back down to 0, charged down to -max_debt.
if back > 0 then
  debt = debt - back * 1000000
  if debt < 0 then debt = 0 end
end
if held == 1 and actual > estimate then
  local deepest = (burst + max_debt) * 1000000
  local charged = debt + (actual - estimate) * 1000000
  if charged > deepest then charged = math.max(debt, deepest) end
  debt = charged
end
if debt ~= before or old then
  redis.call('SET', KEYS[1], string.format('v1:%d %d', debt, now), 'PXAT', full_at(now, debt, rate))
end
return string.format('%d %.6f', held, (burst * 1000000 - debt) / 1000000)
