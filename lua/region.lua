-- tollgate: a region's bookkeeping for one limit across regions (docs/regions.md), in the
-- region's store. One of three operations, ARGV[1]:
--
-- 'add'    KEYS[1] the demand hash; ARGV[2..] pairs of field and count: each count added
--          (HINCRBY) to its field, "<limit> <hex of the key's tail>". The hash expires
--          ARGV[2] ms after the last add, so a region whose reporter is gone keeps none for
--          long. (ARGV[2] is the expiry; the pairs follow from ARGV[3].) Returns the fields.
-- 'lease'  KEYS[1] the reporter's lease; ARGV[2] this instance's id, ARGV[3] its ttl in ms:
--          taken when free (SET NX PX), renewed when held by this id. Returns 1 when held.
-- 'drain'  KEYS[1] the demand hash: TIME read first, then every field and count, the hash
--          deleted. Returns "<now µs>" then field, count, ... (the counts read as sent).
-- 'share'  KEYS[1] a global limit's bucket: TIME, and the share kept beside it
--          (lua/global.lua's "<rate> <size> <until>", or nothing). Returns {now, share}.

local op = ARGV[1]
if op == 'add' then
  local n = 0
  for i = 3, #ARGV - 1, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
    n = n + 1
  end
  if n > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return n
end
if op == 'lease' then
  local held = redis.call('GET', KEYS[1])
  if held == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return 1
  end
  if held then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if op == 'drain' then
  local t = redis.call('TIME')
  local out = {string.format('%d', t[1] * 1000000 + t[2])}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all do out[#out + 1] = all[i] end
  redis.call('DEL', KEYS[1])
  return out
end
if op == 'share' then
  local t = redis.call('TIME')
  local share = redis.call('GET', KEYS[1] .. ':g')
  return {string.format('%d', t[1] * 1000000 + t[2]), share or ''}
end
return redis.error_reply('ERR tollgate: unknown region operation')
