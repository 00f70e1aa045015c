-- refund.lua: gives back tokens that token_bucket.lua charged, for a request
-- that a Redis Cluster decided in several calls (one per slot) and that a
-- zone on another slot denied. It takes away exactly what the charge added
-- to each bucket's debt, never below a full bucket. Arithmetic and state as
-- in token_bucket.lua.
--
-- KEYS[i]            the bucket of zone i
-- ARGV[1]            "0": the clock is Redis TIME; otherwise a fixed time in
--                    microseconds, for tests only
-- ARGV[2+3(i-1)...]  per zone i: denom, interval (ticks per token), cost
--
-- Returns the number of buckets refunded.

local now
if ARGV[1] == '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

local refunded = 0
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 3
  local denom = tonumber(ARGV[a])
  local interval = tonumber(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  local v = redis.call('GET', KEYS[i])
  if v and cost > 0 then
    local us = tonumber(string.sub(v, 1, -4)) or 0
    local ticks = tonumber(string.sub(v, -3)) or 0
    if ticks >= denom then
      us = us + math.floor(ticks / denom)
      ticks = ticks % denom
    end
    local debt = 0
    if us > now or (us == now and ticks > 0) then
      debt = (us - now) * denom + ticks
    end
    debt = debt - cost * interval
    if debt <= 0 then
      redis.call('DEL', KEYS[i])
    else
      local state = string.format('%d%03d', now + math.floor(debt / denom), debt % denom)
      local ttl = math.floor((debt + denom * 1000 - 1) / (denom * 1000))
      redis.call('SET', KEYS[i], state, 'PX', ttl)
    end
    refunded = refunded + 1
  end
end
return refunded
