-- prelude.lua: what every algorithm shares. The scripts are assembled by
-- lua.go: this prelude, one file per algorithm (each registers its check,
-- commit and refund in ALG), then decide.lua or refund.lua.
--
-- Numbers stay integers well below 2^53, so that Lua's doubles compute
-- exactly what the Go limiter computes (limiter/*.go).

local ALG = {}

-- The clock: Redis TIME (always, in production), or a fixed time in
-- microseconds that tests pass as ARGV[1].
local function clock()
  if ARGV[1] == '0' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(ARGV[1])
end

-- A bucket's state is one integer in a string: a time in microseconds x
-- 1000 plus a remainder (token and leaky bucket), or packed window counters.
local function get_int(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  return v
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end
