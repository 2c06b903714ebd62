-- wrk script: one key (/check/hot) at about $RATE checks per second (default 5000) over
-- $CONNS connections (default 64): each connection waits CONNS / RATE seconds between its
-- requests (wrk's delay, in ms).
local rate = tonumber(os.getenv("RATE") or "5000")
local conns = tonumber(os.getenv("CONNS") or "64")

request = function()
  return wrk.format("GET", "/check/hot")
end

delay = function()
  return 1000 * conns / rate
end
