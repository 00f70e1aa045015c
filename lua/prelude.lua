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

-- The functions the scripts call, as locals: a global is a table lookup on
-- every use.
local call, tonumber, floor, min, max = redis.call, tonumber, math.floor, math.min, math.max
local format, sub, match = string.format, string.sub, string.match

-- The clock: Redis TIME (always, in production), or a fixed time in
-- microseconds that tests pass as ARGV[1].
local now
if ARGV[1] == '0' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

local function ceil_div(a, b)
  return floor((a + b - 1) / b)
end

-- The string-valued buckets (token and leaky buckets, windows) are read
-- all at once when the call starts (one MGET, cheaper than a GET per
-- bucket) and written when it ends (flush), each once however many
-- requests of the batch used it, with its last value and time to live. The
-- call is atomic, so no one sees the values in between. A bucket key that
-- holds another type reads as empty and is overwritten.
local cached, ttl = {}, {}
do
  local n = #KEYS
  for first = 1, n, 1000 do
    local last = min(first + 999, n)
    local vals = call('MGET', unpack(KEYS, first, last))
    for i = first, last do cached[KEYS[i]] = vals[i - first + 1] end
  end
end

-- get returns a bucket's value, or false when it has none.
local function get(key)
  return cached[key]
end

-- put sets a bucket's value with a time to live in milliseconds, or
-- deletes it (v false).
local function put(key, v, px)
  cached[key], ttl[key] = v, px or 0
end

-- flush writes what put changed.
local function flush()
  for i = 1, #KEYS do
    local key = KEYS[i]
    local px = ttl[key]
    if px then
      local v = cached[key]
      if v then call('SET', key, v, 'PX', px) else call('DEL', key) end
      ttl[key] = nil
    end
  end
end
