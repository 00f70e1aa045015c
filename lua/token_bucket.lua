-- token_bucket.lua: a bucket of burst tokens refilled one every interval
-- ticks (a tick is 1/denom microsecond). Its state is GCRA's theoretical
-- arrival time: when the bucket will be full again, as microseconds x 1000
-- plus the sub-microsecond ticks. A missing key is a full bucket; each key
-- expires when its bucket is full again. See limiter/tokenbucket.go.
--
-- Parameters: p1 denom, p2 interval, p3 burst (p4 max delay: leaky bucket).
-- Reply: flag, debt before the request (ticks), debt after it, 0.

-- debt returns the ticks the bucket owes at now, at most its capacity.
local function tb_debt(key, denom, cap, now)
  local v = get_int(key)
  if not v then return 0 end
  local us = tonumber(string.sub(v, 1, -4)) or 0
  local ticks = tonumber(string.sub(v, -3)) or 0
  if ticks >= denom then -- written under a rule with a finer tick
    us = us + math.floor(ticks / denom)
    ticks = ticks % denom
  end
  if us < now or (us == now and ticks == 0) then return 0 end
  if us - now > math.floor(cap / denom) then return cap end
  return math.min((us - now) * denom + ticks, cap)
end

-- tb_write stores a debt of ticks at now, expiring when the bucket is full.
local function tb_write(key, denom, debt, now)
  if debt <= 0 then
    redis.call('DEL', key)
    return
  end
  local state = string.format('%d%03d', now + math.floor(debt / denom), debt % denom)
  redis.call('SET', key, state, 'PX', ceil_div(debt, denom * 1000))
end

ALG[0] = {
  check = function(key, p, cost, now)
    local denom, interval, burst = p[1], p[2], p[3]
    local cap = burst * interval
    local debt = tb_debt(key, denom, cap, now)
    if cost > burst then return {2, debt, debt, 0} end
    local after = debt + cost * interval
    if after <= cap then return {1, debt, after, 0} end
    return {0, debt, after, 0}
  end,
  commit = function(key, p, cost, now, v)
    tb_write(key, p[1], v[3], now)
  end,
  refund = function(key, p, cost, now)
    local denom, interval, burst = p[1], p[2], p[3]
    local debt = tb_debt(key, denom, burst * interval, now)
    tb_write(key, denom, debt - cost * interval, now)
  end,
}
