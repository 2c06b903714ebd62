-- wrk script: every request checks one of $KEYS distinct keys (default 10000), carried in the
-- path (/check/k<n>) so that oha's --rand-regex-url can produce the same spread. $PREFIX
-- replaces "/check/k" (bench/policies.sh sends exempt checks under another path).
local keys = tonumber(os.getenv("KEYS") or "10000")
local prefix = os.getenv("PREFIX") or "/check/k"

request = function()
  return wrk.format("GET", prefix .. math.random(0, keys - 1))
end
