-- Runtime overrides: writes back what an instance still holds after the store lost its data
-- (a Redis restarted without persistence). Every instance that sees the loss asks; per limit,
-- the newest view wins, so a deletion one instance saw is not undone by another instance that
-- missed it (it was paused or partitioned) and asked first.
--
-- KEYS[1]  the version hash; KEYS[2] the restored hash (field = limit, value = '<held> <at>':
--          the version the writer held before the loss, and the version its write-back gave
--          the limit); KEYS[3] the store's epoch (marked); then per limit named in ARGV, in
--          order: its entry hash, change log, expiry index, floor and history
--          (override_log.lua)
-- ARGV[1]  most entries a limit may hold (sizes the log)
-- ARGV[2..] per limit: name, the version this instance holds (from before the loss), number
--          of entries, then tail and JSON per entry
--
-- A limit is written when nothing was written to it since the loss, or when it was written
-- back from an older version than this one holds and has not changed since: a change made
-- after the loss (a PUT, a DELETE) always stands. Versions are never handed out twice
-- (override_log.lua's bump), so a newer held version saw every change an older one did.
-- A limit written is replaced whole (entries held before go), its version moves and its floor
-- with it, so every instance reads it whole again.
--
-- Returns how many limits were written.

local now = now_ms()
mark_epoch(KEYS[3])
local max = tonumber(ARGV[1])
local at = 2
local wrote = 0
for k = 4, #KEYS, 5 do
  local hash, log, expiries, floor, history = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local limit, held = ARGV[at], tonumber(ARGV[at + 1])
  local count = tonumber(ARGV[at + 2])
  at = at + 3
  local current = redis.call('HGET', KEYS[1], limit)
  local marker = redis.call('HGET', KEYS[2], limit)
  local write
  if marker then
    local from, since = string.match(marker, '^(%d+) (%d+)$')
    write = tonumber(from) ~= nil and tonumber(from) < held and since == current
  else
    write = not current
  end
  if write then
    redis.call('DEL', hash, expiries)
    local written = {}
    for i = 1, count do
      local tail, json = ARGV[at + 2 * i - 2], ARGV[at + 2 * i - 1]
      local expires = expiry_of(json)
      if not (expires and expires <= now) then
        redis.call('HSET', hash, tail, json)
        if expires then
          redis.call('ZADD', expiries, string.format('%d', expires), tail)
        end
        written[#written + 1] = tail
      end
    end
    -- Every instance reads the whole limit again: what it held may differ from what is here.
    local version = bump(KEYS[1], limit)
    log_changes(log, history, floor, version, written, max)
    redis.call('SET', floor, string.format('%d', version))
    redis.call('HSET', KEYS[2], limit, string.format('%d %d', held, version))
    wrote = wrote + 1
  end
  at = at + 2 * count
end
return wrote
