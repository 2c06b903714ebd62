-- tollgate reset: deletes one key (an absent bucket reads as full, an absent quota as unused)
-- and announces it on the reset channel in the same atomic call, so no instance can miss a
-- reset that happened: every instance's deny cache drops the key when the message arrives.
--
-- KEYS[1]  the bucket or quota
-- ARGV[1]  the reset channel (<key_prefix>:resets)
--
-- Returns 1 if the key existed, 0 if it was already full.

local existed = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], KEYS[1])
return existed
