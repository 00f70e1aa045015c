-- prelude.lua: what every algorithm shares. lua.go assembles the scripts:
-- the wire format's header (lua/wire.go), this prelude, the helpers of
-- every algorithm file, then decide.lua or refund.lua with each
-- algorithm's check, commit and refund sections inlined into one
-- if/elseif chain on the zone's algorithm. Inlining keeps
-- the work each call does to the request itself: a script's body runs in
-- full on every EVALSHA, so functions and tables built at its top level
-- would be built again for every decision.
--
-- Numbers stay integers well below 2^53, so that Lua's doubles compute
-- exactly what the Go limiter computes (limiter/*.go).

-- The functions and arguments the scripts use, as locals: a global is a
-- table lookup on every use.
local call, tonumber, floor, min, max = redis.call, tonumber, math.floor, math.min, math.max
local format, sub, match = string.format, string.sub, string.match
local KEYS, ARGV = KEYS, ARGV

-- The clock: Redis TIME (always, in production), or a fixed time in
-- microseconds that tests pass as ARGV[ARG_CLOCK].
local now
if ARGV[ARG_CLOCK] == '0' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[ARG_CLOCK])
end

-- The rules, zones and zone kinds, which decide.lua and refund.lua take
-- alike (see decide.lua and lua/wire.go): rules[i] holds rule i's
-- RULE_ARGS arguments as numbers, at their positions (rule[R_ALG] …); a
-- kind k is a rule, a cost and an aux, which many zones of a batch share
-- (krule[k] the rule's table, kcost[k], kaux[k] the aux as sent and
-- kauxn[k] as a number, 0 if it is none), so that a zone's own argument is
-- one number, its bucket and kind (see zone.lua). The zones' arguments are
-- ARGV[zones] to ARGV[zones_end].
local rules, nrules = {}, tonumber(ARGV[ARG_RULES])
for i = 1, nrules do
  local b = ARG_RULES + (i - 1) * RULE_ARGS -- the argument before rule i's
  local rule = {unpack(ARGV, b + 1, b + RULE_ARGS)}
  for j = 1, RULE_ARGS do rule[j] = tonumber(rule[j]) end
  rules[i] = rule
end
local nkinds = tonumber(ARGV[#ARGV])
local zones, zones_end = ARG_RULES + 1 + RULE_ARGS * nrules, #ARGV - 1 - KIND_ARGS * nkinds
local krule, kcost, kaux, kauxn = {}, {}, {}, {}
for k = 1, nkinds do
  local b = zones_end + (k - 1) * KIND_ARGS -- the argument before kind k's
  local aux = ARGV[b + K_AUX]
  krule[k], kcost[k], kaux[k], kauxn[k] = rules[tonumber(ARGV[b + K_RULE])], tonumber(ARGV[b + K_COST]), aux, tonumber(aux) or 0
end
local nkeys = #KEYS -- for zone.lua

local function ceil_div(a, b)
  return floor((a + b - 1) / b)
end

-- The string-valued buckets (token and leaky buckets, windows) are read
-- all at once when the call starts (one MGET, cheaper than a GET per
-- bucket) and written when it ends (flush), each once however many
-- requests of the batch used it, with its last value and time to live. The
-- call is atomic, so no one sees the values in between. KEYS holds each
-- bucket once; the helpers name a bucket by its index ki in KEYS. A bucket
-- key that holds another type reads as empty and is overwritten.
--
-- Between the two, a bucket's value stays in the form its algorithm
-- computes with, so that a batch that uses one bucket many times parses
-- and formats it once: vals[ki] is the value as stored (a string, or false
-- for none), or a window's packed counters (a number, stored as '%d'), or
-- true for a token bucket's time (microseconds tus[ki] and ticks tks[ki],
-- stored as '%d%03d'). get returns the stored form whatever it holds, so
-- an algorithm that finds another's state reads exactly what Redis would
-- hold.
local vals, ttl, tus, tks
if #KEYS <= 1000 then
  vals = call('MGET', unpack(KEYS))
else -- unpack has a limit
  vals = {}
  for first = 1, #KEYS, 1000 do
    local last = min(first + 999, #KEYS)
    local got = call('MGET', unpack(KEYS, first, last))
    for i = first, last do vals[i] = got[i - first + 1] end
  end
end
ttl, tus, tks = {}, {}, {}

-- digits returns the decimal digits of a whole number.
local function digits(n)
  return format('%d', n)
end

-- get returns a bucket's value as stored, or false when it has none.
local function get(ki)
  local v = vals[ki]
  if v == true then
    v = format('%d%03d', tus[ki], tks[ki])
    vals[ki] = v
  elseif v and type(v) == 'number' then
    v = digits(v)
    vals[ki] = v
  end
  return v
end

-- put sets a bucket's value with a time to live in milliseconds, or
-- deletes it (v false). v may be in any form vals holds (for true, set
-- tus[ki] and tks[ki] first).
local function put(ki, v, px)
  vals[ki], ttl[ki] = v, px or 0
end

-- flush writes what put changed.
local function flush()
  for ki = 1, #KEYS do
    local px = ttl[ki]
    if px then
      local v = get(ki)
      if v then call('SET', KEYS[ki], v, 'PX', digits(px)) else call('DEL', KEYS[ki]) end
    end
  end
end
