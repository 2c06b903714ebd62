-- A borrowing bucket's held groups (lua/token_bucket.lua, "A borrowing bucket"), as its value
-- carries them after the debt and ts: ' <deadline> <micro-tokens>' for each, then
-- ' i<incarnation>'. Loaded in front of lua/global.lua, which lua/token_bucket.lua,
-- lua/global_share.lua and lua/peek.lua load in front of themselves.

-- The groups in `rest` (nil: none), the earliest deadline first, as {deadline, micro-tokens}
-- pairs; their incarnation (nil when the value names none) and the tokens they hold.
local function read_groups(rest)
  local g, inc = {}, nil
  if rest then
    for d, h in string.gmatch(rest, ' (%d+) (%d+)') do
      g[#g + 1] = {tonumber(d), tonumber(h)}
    end
    inc = tonumber(string.match(rest, ' i(%d+)$'))
  end
  if #g == 2 and g[2][1] < g[1][1] then g[1], g[2] = g[2], g[1] end
  local held = 0
  for _, group in ipairs(g) do held = held + group[2] end
  return g, inc, held
end

-- The groups of `g` that hold anything, spelled for the value, `inc` after them; and the moment
-- the key's expiry counts from: the last of their deadlines, or `now`.
local function spell_groups(g, inc, now)
  local fields, last = '', now
  for _, group in ipairs(g) do
    if group[2] > 0 then
      fields = fields .. string.format(' %d %d', group[1], group[2])
      if group[1] > last then last = group[1] end
    end
  end
  if fields ~= '' and inc then fields = fields .. string.format(' i%d', inc) end
  return fields, last
end

