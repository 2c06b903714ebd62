-- tollgate calendar periods in UTC, prefixed to the scripts that count quotas
-- (token_bucket.lua, report.lua). Redis's Lua has no os.date, so this counts whole days since
-- 1970-01-01 with integer arithmetic only (civil-from-days, after Howard Hinnant). Its Rust twin
-- is crates/tollgate-core/src/base/calendar.rs; the tests run one table of instants through both.
--
-- period_bounds(code, now_s) -> start, stop: the period holding Unix second now_s, [start, stop).
-- code: 'h' hour, 'd' day, 'w' ISO week (from Monday), 'm' calendar month.

local function period_bounds(code, now_s)
  local floor = math.floor
  if code == 'h' then
    local start = floor(now_s / 3600) * 3600
    return start, start + 3600
  end
  local day = floor(now_s / 86400)
  if code == 'd' then
    return day * 86400, (day + 1) * 86400
  end
  if code == 'w' then
    -- 1970-01-01 was a Thursday; Lua's % is floored, so this holds before 1970 too.
    local monday = day - (day + 3) % 7
    return monday * 86400, (monday + 7) * 86400
  end
  local z = day + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local mday = doy - floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  local length = 31
  if month == 4 or month == 6 or month == 9 or month == 11 then
    length = 30
  elseif month == 2 then
    local leap = (year % 4 == 0 and year % 100 ~= 0) or year % 400 == 0
    length = leap and 29 or 28
  end
  local first = day - (mday - 1)
  return first * 86400, (first + length) * 86400
end

