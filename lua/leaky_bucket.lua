-- leaky_bucket.lua: a shaper. Its state is the token bucket's (the moment
-- the queue drains). A request waits for its turn, as long as at most
-- burst tokens are queued with it and its wait (the debt) is at most
-- max_delay microseconds. See limiter/leakybucket.go.
--
-- Parameters: p1 denom, p2 interval, p3 burst, p4 max delay (us).
-- Reply: flag, debt before the request (its wait, in ticks), debt after, 0.

ALG[4] = {
  check = function(key, p, cost, now)
    local denom, interval, burst, max_delay = p[1], p[2], p[3], p[4]
    local cap = burst * interval
    local debt = tb_debt(key, denom, cap, now)
    if cost > burst then return {2, debt, debt, 0} end
    local after = debt + cost * interval
    if after <= cap and ceil_div(debt, denom) <= max_delay then return {1, debt, after, 0} end
    return {0, debt, after, 0}
  end,
  commit = ALG[0].commit,
  refund = ALG[0].refund,
}
