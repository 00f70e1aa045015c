-- leaky_bucket.lua: a shaper. Its state is the token bucket's (the moment
-- the queue drains). A request waits for its turn, as long as at most
-- burst tokens are queued with it and its wait (the debt) is at most
-- max_delay microseconds. See limiter/leakybucket.go.
--
-- Parameters: p1 denom, p2 interval, p3 burst, p4 max delay (us); aux the
-- reserve (ticks).
-- Reports: flag, debt before the request (its wait, in ticks), debt after, 0.

--@check
local cap, res = p3 * p2, auxn
r1 = tb_debt(ki, p1, cap)
if cost > p3 or cost * p2 + res > cap then
  flag, r2 = NEVER, r1
else
  r2 = r1 + cost * p2
  if r2 + res <= cap and ceil_div(r1, p1) <= p4 then flag = ADMIT else flag = DENY end
end

--@commit
tb_write(ki, p1, r2)

--@refund
if auxn < CHARGE then -- a charge of CHARGE - auxn ticks, debt beyond capacity allowed
  tb_write(ki, p1, min(tb_debt(ki, p1, MAX_DEBT) + CHARGE - auxn, MAX_DEBT))
else
  tb_write(ki, p1, tb_debt(ki, p1, p3 * p2) - cost * p2)
end
