-- tollgate: writes the share the home assigned a region for one key of a global limit
-- (loaded with lua/bounds.lua, lua/stored.lua and lua/global.lua in front: the record and the arithmetic are
-- described there).
--
-- KEYS[1]  the bucket; its share is KEYS[1] .. ':g'
-- ARGV[1]  'G<floor in millionths>:<rate>' as a check spells the key (the region's numbers now)
-- ARGV[2]  the limit's burst for the key
-- ARGV[3]  the new share's rate, tokens per second (>= 0)
-- ARGV[4]  the new share's size, whole tokens (>= 0)
-- ARGV[5]  the new share's end, µs of this server's TIME (0: no share)
--
-- The bucket is first brought to now under the old share, then kept at its level, capped at
-- the new size less the tokens instances hold of it (their slices count against the new
-- share): a change never refills a past stretch at the new rate, and never adds tokens.
-- An absent bucket stays absent: full at the size its next check finds, as Envoy starts a
-- first bucket full (the home's escrow pays for that size).
-- Returns "<level in micro-tokens> <now>".

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local us = t[2]
if #us < 6 then us = string.rep('0', 6 - #us) .. us end
local ts = t[1] .. us

local g = GLOBAL[ARGV[1]]
local burst, rate, size, untl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5])
if not (g and burst and burst >= 1 and burst <= MAX_COUNT) then refuse(1, 'burst') end
if not (rate and rate >= 0 and rate < math.huge) then refuse(1, 'share rate') end
if not (size and size >= 0 and size <= MAX_COUNT and untl and untl >= 0 and untl < MAX_TS_US) then
  refuse(1, 'share')
end
local key = KEYS[1]
local old = global_numbers(g, burst, key)
local debt, at, _, rest = read_bucket(key, burst)
-- Held groups (instances borrow from the key): read, the ended ones ended, under the old share.
local lend
if rest and rest ~= '' then lend = {grid = 1, want = 0, gd = 0, gx = 0, gr = 0, gi = 0} end
local level
if lend then level = global_lent(old, lend, debt, at, rest, now) else level = global_level(old, debt, at, now) end

redis.call('SET', key .. ':g', string.format('%.17g %d %d', rate, size, untl),
  'PXAT', expire_at(untl, 0))
local new = global_numbers(g, burst, key)
local size_now = new.fc
if now < new.u then size_now = new.s1 end
-- The slices still out count against the new size: the level is at most what it leaves.
local held = 0
if lend then
  for _, group in ipairs(lend.g) do held = held + group[2] end
end
if not debt then
  -- No bucket: full, at whatever size its next check finds.
  level = size_now
elseif level > size_now - held then
  level = size_now - held
end
if debt and lend then
  local fields, last = spell_groups(lend.g, lend.inc, now)
  global_write(key, new, level, now, ts, fields, last)
elseif debt then
  global_write(key, new, level, now, ts)
end
return string.format('%d %d', level, now)
