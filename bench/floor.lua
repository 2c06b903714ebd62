-- The floor a token-bucket script is measured against: only the commands a bucket needs
-- (TIME, HMGET, HSET, PEXPIRE per key), with no arithmetic and a constant reply. Same KEYS
-- and ARGV layout as lua/token_bucket.lua; writes ARGV[4i-2] (the burst) as the tokens.

local t = redis.call('TIME')
for i = 1, #KEYS do
  redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  redis.call('HSET', KEYS[i], 'tokens', ARGV[4 * i - 2], 'ts', t[1])
  redis.call('PEXPIRE', KEYS[i], 60000)
end
return 1
