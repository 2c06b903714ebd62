-- The holders of a pool of RLQS shares, as stored (read-only; see lua/rlqs.lua), and now.
-- KEYS[1]  the pool
-- Returns  {now_us, id, "demand_milli last_us n_rate (units until_us)* n_size (units until_us)*", ...}
--          (and the field "escrow" -> "micro_tokens free_rate at_us", which the reader skips)
local t = redis.call('TIME')
local out = {string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat do out[#out + 1] = flat[i] end
return out
