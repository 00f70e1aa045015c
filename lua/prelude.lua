-- prelude.lua: what every algorithm shares. lua.go assembles the scripts:
-- this prelude, the helpers of every algorithm file, then decide.lua or
-- refund.lua with each algorithm's check, commit and refund sections
-- inlined into one if/elseif chain on the zone's algorithm. Inlining keeps
-- the work each call does to the request itself: a script's body runs in
-- full on every EVALSHA, so functions and tables built at its top level
-- would be built again for every decision.
--
-- Numbers stay integers well below 2^53, so that Lua's doubles compute
-- exactly what the Go limiter computes (limiter/*.go).

-- The clock: Redis TIME (always, in production), or a fixed time in
-- microseconds that tests pass as ARGV[1].
local now
if ARGV[1] == '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end
