-- tollgate's stored forms: how a bucket is kept in Redis, read, refilled and expired, and how
-- held things (leases, reservations) are. Loaded after lua/bounds.lua (its numbers) by the
-- scripts that read or write buckets; lua/token_bucket.lua loads it behind its plain checks,
-- which spell out what they need of it.
--
-- expire_at(now_us, ttl_us) is the PEXPIREAT argument, an integer in '%d': the millisecond
-- after now + ttl, ttl capped at MAX_TTL_MS (a NaN or infinite ttl counts as the cap).
--
-- A bucket is stored as how far it is below full: one string key "v1:<debt> <ts>", the debt in
-- micro-tokens and ts in microseconds of this server's TIME, both integers; tokens = burst -
-- debt / 10^6. A full bucket is an absent key; a debt is at most MAX_DEBT_UT (lua/bounds.lua).
--
-- "v1:" is the format's marker: the next change of format changes it (a letter first). A value
-- that starts with a letter and is not this format, well formed, is refused (unknown_format:
-- an error, which the instance answers per its store.on_error), never read as full: an
-- instance never grants the tokens a format it does not know may hold. A value without a
-- marker, "<debt> <ts>...", was written by a build from before the marker: read exactly as the
-- marked one; a write marks it. Any other value that is not two such integers is garbage and
-- reads as full.
--
-- A borrowing bucket (token_bucket.lua) carries its held groups after them:
-- "v1:<debt> <ts> <deadline> <micro-tokens>[ <deadline> <micro-tokens>]".
--
-- read_bucket(key, burst) returns the stored debt and ts (ts as the text stored), nil, and
-- the rest of the value (its held groups, '' when none), or nil for a full bucket (absent or
-- garbage). A hash {tokens, ts} of decimal floats, the form of the 0.1.0 release,
-- reads as the debt it stands for, with a third value true: the caller that writes
-- converts it (a rolling upgrade: its level carries over, no budget is granted twice).
-- refilled(debt, at, now, rate) is that debt at `now`: lowered by the whole micro-tokens
-- refilled since `at` (a clock gone backwards refills nothing), never below 0.
-- full_at(now_us, debt, rate) is the SET ... PXAT argument: the millisecond after the bucket is
-- full again, bounded as expire_at.
--
-- Held things (a concurrency key's leases, a bucket's reservations) are sorted sets of members
-- scored by their expiry in µs of TIME; one is held while its expiry is after now.
-- hold(key, until, member, grace_us) adds one, the key living as long as its last member and
-- grace_us more (a refunding bucket's expired reservations must still be found to be given
-- back: for as long as the bucket takes to refill its burst).
-- sweep(key, late, now, refund) moves the expired members of a bucket's reservations (members
-- '<id>:<estimate>') to `late`, its expired reservations, and returns the tokens to give back:
-- the sum of their estimates when `refund`, else 0 (the estimate is kept: the request is taken
-- to have cost it). A request may outlive its reservation; its late settle (lua/settle.lua)
-- still applies the difference once, for LATE_GRACE_US after the expiry. `late` holds them as
-- '<id>:<estimate>:r' when their estimates were given back, '<id>:<estimate>:k' when kept (the
-- settle applies what the expiry did, whatever mode the settling instance runs now), scored by
-- the end of that grace (and lives as long as its last one), at most MAX_LATE per bucket (the
-- oldest go first: one dropped keeps what its expiry did, so nothing is ever given back twice).
-- A reservations set outlives its last member by LATE_GRACE_US at least, so that an expired
-- reservation is still found, and moved, by the next check or settle.

local function expire_at(now_us, ttl_us)
  if not (ttl_us <= MAX_TTL_US) then ttl_us = MAX_TTL_US end
  if ttl_us < 0 then ttl_us = 0 end
  local at_ms = (now_us + ttl_us) / 1000
  return string.format('%d', at_ms - at_ms % 1 + 1)
end

local function unknown_format()
  error({err = 'ERR tollgate: a bucket value this release cannot read (another format): '
    .. 'refused, not read as full'})
end

local function read_bucket(key, burst)
  local stored = redis.pcall('GET', key)
  if not stored then return nil end
  if type(stored) == 'string' then
    local debt, at, rest = string.match(stored, '^v1:(%d+) (%d+)(.*)$')
    if debt then
      debt = tonumber(debt)
      if debt <= MAX_DEBT_UT and (rest == '' or string.match(rest, '^ %d+ %d+')) then
        return debt, at, nil, rest
      end
      unknown_format()
    end
    if string.find(stored, '^%a') then unknown_format() end
    -- Unmarked: written before the marker, read the same.
    debt, at, rest = string.match(stored, '^(%d+) (%d+)(.*)$')
    debt = tonumber(debt)
    if debt and debt <= MAX_DEBT_UT and (rest == '' or string.match(rest, '^ %d+ %d+')) then
      return debt, at, nil, rest
    end
    return nil
  end
  if type(stored) ~= 'table' then return nil end
  -- WRONGTYPE: an earlier release's hash.
  local old = redis.call('HMGET', key, 'tokens', 'ts')
  local level, at = tonumber(old[1]), tonumber(old[2])
  if not (level and at and level == level and at >= 0 and at < MAX_TS_US) then return nil end
  local debt = math.ceil((burst - level) * 1000000)
  if debt < 0 then debt = 0 end
  if not (debt <= MAX_DEBT_UT) then return nil end
  return debt, string.format('%d', at), true
end

local function refilled(debt, at, now, rate)
  local elapsed = now - at
  if elapsed > 0 then
    debt = debt - math.floor(elapsed * rate)
    if debt < 0 then debt = 0 end
  end
  return debt
end

local function full_at(now_us, debt, rate)
  return expire_at(now_us, math.ceil(debt / rate))
end

local function hold(key, until_us, member, grace_us)
  redis.call('ZADD', key, until_us, member)
  -- Scores are whole µs, below 2^53.
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, expire_at(tonumber(last[2]), grace_us))
end

local function sweep(key, late, now, refund)
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'WITHSCORES')
  if #gone == 0 then return 0 end
  local back = 0
  local flag = refund and ':r' or ':k'
  redis.call('ZREMRANGEBYSCORE', late, '-inf', now)
  -- ZADD in slices: Lua's stack takes a few thousand arguments.
  for first = 1, #gone, 2000 do
    local args = {}
    for i = first, math.min(first + 1998, #gone - 1), 2 do
      if refund then back = back + (tonumber(string.match(gone[i], ':(%d+)$')) or 0) end
      args[#args + 1] = string.format('%d', tonumber(gone[i + 1]) + LATE_GRACE_US)
      args[#args + 1] = gone[i] .. flag
    end
    redis.call('ZADD', late, unpack(args))
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local over = redis.call('ZCARD', late) - MAX_LATE
  if over > 0 then redis.call('ZREMRANGEBYRANK', late, 0, over - 1) end
  local last = redis.call('ZRANGE', late, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', late, expire_at(tonumber(last[2]), 0))
  return back
end
