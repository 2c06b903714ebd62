-- tollgate release: gives back one lease of a concurrency key (POST /release).
--
-- KEYS[1]  a concurrency key: a sorted set of lease ids scored by expiry (µs of TIME), as
--          lua/token_bucket.lua writes it
-- ARGV[1]  the lease id
--
-- Returns 1 when the lease was held (taken, not expired, not released before), else 0: a
-- second release of the same id changes nothing. Expired leases are dropped on the way, as a
-- check would drop them.

local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZREM', KEYS[1], ARGV[1])
