-- tollgate bounds: the numbers a bucket may carry, prefixed to the scripts that write buckets
-- (token_bucket.lua, report.lua, refund.lua), before lua/stored.lua. tollgate refuses any other number before it
-- reaches Redis (config validation, the admin API, POST /report); these checks keep a script
-- from writing a state it cannot express if one slips through anyway: a script refuses the
-- whole call before its first write, rather than let string.format('%d') turn a huge expiry
-- into INT64_MIN, which PEXPIREAT reads as "delete now" (a debt forgiven).
--
-- MAX_COUNT     largest burst, quota, max_debt or report cost (Rust: config::MAX_BURST)
-- MAX_COST      largest cost of a check: one above MAX_COUNT marks "more than any burst"
-- MAX_REFILL_S  longest (burst + max_debt) / rate: ten years (Rust: config::MAX_REFILL_SECS)
-- MAX_TTL_MS    longest expiry a script sets: twice MAX_REFILL_S. Within validated numbers no
--               expiry reaches it; a stored debt deeper than the numbers allow (numbers lowered
--               since) is kept this long, never dropped early.
--
-- check_bucket(i, rate, burst, cost, debt) refuses (a Redis error naming key i) a rate that is
-- not a finite number > 0, a burst outside 1..MAX_COUNT, a cost outside 0..MAX_COST, a debt
-- outside 0..MAX_COUNT, or a refill of burst + debt longer than MAX_REFILL_S.
-- check_quota(i, quota, cost) refuses a quota outside 1..MAX_COUNT or a cost outside
-- 0..MAX_COST.
-- token_bucket.lua, run by every check, spells these checks out inline with the same bounds.
-- MAX_DEBT_UT   deepest debt a bucket can carry, in micro-tokens (burst + max_debt, each at
--               most MAX_COUNT); MAX_TS_US the latest ts (2^53 µs) a stored value may name.

local MAX_COUNT = 1000000000
local MAX_COST = MAX_COUNT + 1
local MAX_REFILL_S = 315360000
local MAX_TTL_MS = 2 * MAX_REFILL_S * 1000
local MAX_TTL_US = MAX_TTL_MS * 1000
-- Rust: store::LATE_SETTLE_GRACE_US and store::MAX_LATE_SETTLES.
local LATE_GRACE_US = 86400 * 1000000
local MAX_LATE = 10000

local function refuse(i, what)
  error({err = 'ERR tollgate: key ' .. i .. ': ' .. what .. ' is out of bounds'})
end

local function check_bucket(i, rate, burst, cost, debt)
  if not (rate and rate > 0 and rate < math.huge) then refuse(i, 'rate') end
  if not (burst and burst >= 1 and burst <= MAX_COUNT) then refuse(i, 'burst') end
  if not (cost and cost >= 0 and cost <= MAX_COST) then refuse(i, 'cost') end
  if not (debt and debt >= 0 and debt <= MAX_COUNT) then refuse(i, 'max_debt') end
  if not ((burst + debt) / rate <= MAX_REFILL_S) then refuse(i, 'refill time') end
end

local function check_quota(i, quota, cost)
  if not (quota and quota >= 1 and quota <= MAX_COUNT) then refuse(i, 'quota') end
  if not (cost and cost >= 0 and cost <= MAX_COST) then refuse(i, 'cost') end
end

local MAX_DEBT_UT = 2 * MAX_COUNT * 1000000
local MAX_TS_US = 9007199254740992
