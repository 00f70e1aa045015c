-- token_bucket.lua: one request against the token buckets of all its zones,
-- atomically. Every zone is checked first; only if all admit is each one
-- charged, so a denied request costs no zone anything.
--
-- The arithmetic is the Go limiter's (limiter/tokenbucket.go), in integers
-- well below 2^53 so that Lua's doubles hold them exactly. A bucket is one
-- integer: the moment it will be full again (GCRA's theoretical arrival
-- time) in microseconds x 1000, plus the sub-microsecond remainder in ticks
-- of 1/denom microsecond. A missing key is a full bucket; each key expires
-- when its bucket is full again.
--
-- KEYS[i]            the bucket of zone i
-- ARGV[1]            "0": the clock is Redis TIME (always, in production);
--                    otherwise a fixed time in microseconds, for tests only
-- ARGV[2+4(i-1)...]  per zone i: denom, interval (ticks per token), burst, cost
--
-- Returns {admitted (1|0), then per zone: debt, debt after, verdict}, where
-- debt is what the bucket owed before the request, in ticks, and verdict is
-- 1 (this zone admits), 0 (denies) or 2 (the cost exceeds the burst).

local now
if ARGV[1] == '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

local n = #KEYS
local reply = {1}
local admit = true
for i = 1, n do
  local a = 2 + (i - 1) * 4
  local denom = tonumber(ARGV[a])
  local interval = tonumber(ARGV[a + 1])
  local burst = tonumber(ARGV[a + 2])
  local cost = tonumber(ARGV[a + 3])
  local cap = burst * interval

  local debt = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local us = tonumber(string.sub(v, 1, -4)) or 0
    local ticks = tonumber(string.sub(v, -3)) or 0
    if ticks >= denom then
      us = us + math.floor(ticks / denom)
      ticks = ticks % denom
    end
    if us > now or (us == now and ticks > 0) then
      if us - now > math.floor(cap / denom) then
        debt = cap
      else
        debt = math.min((us - now) * denom + ticks, cap)
      end
    end
  end

  local after, verdict = debt, 2
  if cost <= burst then
    after = debt + cost * interval
    if after <= cap then verdict = 1 else verdict = 0 end
  end
  if verdict ~= 1 then admit = false end
  reply[2 + (i - 1) * 3] = debt
  reply[3 + (i - 1) * 3] = after
  reply[4 + (i - 1) * 3] = verdict
end

if not admit then
  reply[1] = 0
  return reply
end

for i = 1, n do
  local a = 2 + (i - 1) * 4
  local denom = tonumber(ARGV[a])
  local cost = tonumber(ARGV[a + 3])
  if cost > 0 then
    local after = reply[3 + (i - 1) * 3]
    local state = string.format('%d%03d', now + math.floor(after / denom), after % denom)
    local ttl = math.floor((after + denom * 1000 - 1) / (denom * 1000))
    redis.call('SET', KEYS[i], state, 'PX', ttl)
  end
end
return reply
