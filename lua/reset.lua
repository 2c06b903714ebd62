-- tollgate reset: deletes one key (an absent bucket reads as full, an absent quota as unused)
-- and announces it on the reset channel in the same atomic call, so no instance can miss a
-- reset that happened: every instance's deny cache drops the key when the message arrives.
--
-- KEYS[1]  the bucket or quota
-- KEYS[2]  the tokens borrowed from it (KEYS[1] .. ':b', same slot), deleted with it
-- ARGV[1]  the reset channel (<key_prefix>:resets)
--
-- Returns 1 if the key existed, 0 if it was already full.

local existed = redis.call('DEL', KEYS[1])
if KEYS[2] then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', ARGV[1], KEYS[1])
return existed
