-- wrk script: every request checks one of $KEYS distinct keys (default 100000) drawn from a
-- Zipf distribution of exponent $ZIPF_S (default 1.1): key k (from 1) with weight 1 / k^s,
-- in the path (/check/z<k>), as bench/random_key.lua carries its uniform keys.
local keys = tonumber(os.getenv("KEYS") or "100000")
local s = tonumber(os.getenv("ZIPF_S") or "1.1")
local cumulative = {}

init = function()
  local total = 0
  for k = 1, keys do
    total = total + 1 / k ^ s
    cumulative[k] = total
  end
  for k = 1, keys do cumulative[k] = cumulative[k] / total end
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 100000)
end

request = function()
  local draw, lo, hi = math.random(), 1, keys
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cumulative[mid] < draw then lo = mid + 1 else hi = mid end
  end
  return wrk.format("GET", "/check/z" .. lo)
end
