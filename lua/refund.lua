-- tollgate refund (prefixed with lua/bounds.lua and lua/stored.lua: expire_at): gives back what lua/token_bucket.lua charged for a request that was then
-- denied by another slot (Redis Cluster: a request whose buckets live in several slots is
-- decided one slot at a time, and all-or-nothing is restored by refunding).
--
-- KEYS[i]     bucket i, charged earlier by token_bucket.lua on this same slot
-- ARGV[4i-3]  rate of bucket i, tokens per second; or a quota's period code; or the lease
--             that call took ('L<ttl in ms>:<id>', as lua/token_bucket.lua reads it); or the
--             reservation it held ('R<ttl>:<id>:<k|r>:<rate>'): removed, and its bucket refunded
-- ARGV[4i-2]  burst of bucket i; or the quota
-- ARGV[4i-1]  the cost that was charged
-- ARGV[4i]    `now` returned by the charging call (microseconds of TIME, as written to `ts`);
--             for a quota, the start of the period the charge counted in (Unix seconds)
--
-- Returns {tokens_1, ..., tokens_n}: what each bucket holds after the refund, as strings.
-- A bucket is its debt (lua/stored.lua): a refund lowers it, and a debt of 0 is an absent key.
--
-- Never gives back more than the charge removed. While a charge is outstanding, the bucket may
-- have refilled up to `burst` and been drawn down again: refill the cap would have discarded
-- without the charge. Giving back the whole cost then would admit more than `burst` in a
-- moment. So: if nobody wrote the bucket since the charge (`ts` is still that moment), the
-- refill since is computed here and the refund is exact (the debt stops at 0); otherwise the
-- refill that may have been absorbed, rate * (now - charged_at), is kept back. That loses at
-- most rate x (one round trip) tokens per refund: a bounded under-admission, never an
-- over-admission. An absent bucket has expired, which means full: nothing to give back. A
-- bucket that carries held groups (borrowed tokens, lua/token_bucket.lua) is not refunded.
-- A quota does not refill: its count goes down by the cost, exactly, if the period it was
-- charged in is still the stored one (otherwise that count is void already).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local reply = {}
for i = 1, #KEYS do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst = tonumber(ARGV[4 * i - 2])
  local cost = tonumber(ARGV[4 * i - 1])
  local charged_at = ARGV[4 * i]
  if string.byte(ARGV[4 * i - 3]) == 82 then
    -- 'R<ttl>:<id>:<k|r>:<rate>': that call's reservation goes; the bucket is refunded below.
    local id, r = string.match(ARGV[4 * i - 3], '^R%d+:(%x+):[kr]:(.+)$')
    redis.call('ZREM', KEYS[i] .. ':r', (id or '') .. ':' .. ARGV[4 * i - 1])
    rate = tonumber(r)
  end
  if string.byte(ARGV[4 * i - 3]) == 76 then
    -- 'L<ttl>:<id>': a lease taken by that call; giving it back is removing it.
    local id = string.match(ARGV[4 * i - 3], ':(%x+)$') or ''
    redis.call('ZREM', KEYS[i], id)
    local held = redis.call('ZCOUNT', KEYS[i], '(' .. string.format('%d', now), '+inf')
    reply[i] = string.format('%.17g', burst - held)
  elseif rate == nil then
    local counted = redis.pcall('HMGET', KEYS[i], 'used', 'start')
    local used = 0
    if not counted.err and counted[2] == charged_at then
      used = math.max(0, (tonumber(counted[1]) or 0) - cost)
      redis.call('HSET', KEYS[i], 'used', string.format('%d', used))
    end
    reply[i] = string.format('%.17g', burst - used)
  else
    local debt, at, _, rest = read_bucket(KEYS[i], burst)
    if debt == nil then
      reply[i] = string.format('%.6f', burst)
    elseif rest ~= '' then
      -- Tokens of this bucket are held (it borrows): the charge stays (fewer tokens than
      -- due until it refills, never more), and the held groups are left as they are.
      reply[i] = string.format('%.6f', (burst * 1000000 - refilled(debt, at, now, rate)) / 1000000)
    else
      -- Micro-tokens: the debt refilled to now, less what may be given back.
      debt = refilled(debt, at, now, rate)
      local give = cost * 1000000
      if at ~= charged_at then
        local since = now - tonumber(charged_at)
        if since < 0 then since = 0 end
        give = give - math.ceil(since * rate)
      end
      if give > 0 then
        debt = debt - give
        if debt < 0 then debt = 0 end
      end
      if debt > 0 then
        -- Expires when full again, as lua/token_bucket.lua does (bounded: lua/bounds.lua).
        redis.call('SET', KEYS[i], string.format('v1:%d %d', debt, now), 'PXAT', full_at(now, debt, rate))
      else
        redis.call('DEL', KEYS[i])
      end
      reply[i] = string.format('%.6f', (burst * 1000000 - debt) / 1000000)
    end
  end
end
return reply
