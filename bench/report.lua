-- wrk script: every request is a POST /report charging one of $KEYS keys (default 10000) of
-- the limit "tokens" a random cost of 1 to 1000, with the admin token from $TOKEN.
local keys = tonumber(os.getenv("KEYS") or "10000")
local headers = {
  ["Content-Type"] = "application/json",
  ["Authorization"] = "Bearer " .. (os.getenv("TOKEN") or ""),
}

request = function()
  local body = string.format('{"limit": "tokens", "key": ["/k%d"], "cost": %d}',
    math.random(0, keys - 1), math.random(1, 1000))
  return wrk.format("POST", "/report", headers, body)
end

-- Counts answers other than 200: a benchmark of refusals would measure nothing.
local failed = 0
response = function(status)
  if status ~= 200 then failed = failed + 1 end
end
done = function()
  io.write(string.format("non-200 answers: %d\n", failed))
end
