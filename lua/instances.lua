-- tollgate instance registry: how many tollgate instances share this Redis.
-- Used by on_error = "local" to split each limit N ways while Redis is unreachable.
--
-- KEYS[1]  a sorted set: member = instance id, score = last heartbeat (ms of Redis TIME)
-- ARGV[1]  this instance's id
-- ARGV[2]  how long a heartbeat counts, in ms
--
-- Returns the number of instances that sent a heartbeat within ARGV[2] ms, this one included.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
