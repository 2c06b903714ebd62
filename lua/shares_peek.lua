-- The holders of a pool of RLQS shares, as stored (read-only; see lua/shares.lua).
-- KEYS[1]  the pool
-- Returns  the hash flat: id, "demand_milli last_us cur_rate cur_size cur_until_us old_rate old_size old_until_us", ...
return redis.call('HGETALL', KEYS[1])
