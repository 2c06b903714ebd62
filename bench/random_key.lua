-- wrk script: every request checks one of $KEYS distinct keys (default 10000), carried in the
-- path (/check/k<n>) so that oha's --rand-regex-url can produce the same spread.
local keys = tonumber(os.getenv("KEYS") or "10000")

request = function()
  return wrk.format("GET", "/check/k" .. math.random(0, keys - 1))
end
