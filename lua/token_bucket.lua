-- token_bucket.lua: a bucket of burst tokens refilled one every interval
-- ticks (a tick is 1/denom microsecond). Its state is GCRA's theoretical
-- arrival time: when the bucket will be full again, as microseconds x 1000
-- plus the sub-microsecond ticks. A missing key is a full bucket; each key
-- expires when its bucket is full again. See limiter/tokenbucket.go.
--
-- Parameters: p1 denom, p2 interval, p3 burst; aux the reserve (ticks);
-- the rule's soft shed (R_SHED_AT, R_SHED_DELAY).
-- Reports: flag, debt before the request (ticks), debt after it, and the
-- spares a prefetch took (admitted) or the debt beyond the capacity
-- (denied: what a charge or a settlement left owing; the Retry-After waits
-- for it too); and an admitted request's soft shed delay (us) as r4.

--@helpers
-- tb_debt returns the ticks the bucket owes at now, at most its capacity,
-- and when it owes more, how much more (the whole debt at most MAX_DEBT).
local function tb_debt(ki, denom, cap)
  local us, ticks
  local v = vals[ki]
  if v == true then -- as this call left it (see put)
    us, ticks = tus[ki], tks[ki]
  else
    if not v then return 0 end
    v = get(ki) -- a string, whatever put it
    us = tonumber(sub(v, 1, -4)) or 0
    ticks = tonumber(sub(v, -3)) or 0
  end
  if ticks >= denom then -- written under a rule with a finer tick
    us = us + floor(ticks / denom)
    ticks = ticks % denom
  end
  if us < now or (us == now and ticks == 0) then return 0 end
  if us - now > floor(cap / denom) then return cap, min((us - now) * denom + ticks, MAX_DEBT) - cap end
  local debt = (us - now) * denom + ticks
  if debt > cap then return cap, min(debt, MAX_DEBT) - cap end
  return debt
end

-- tb_write stores (puts) a debt of ticks at now, expiring when the bucket is
-- full: as the time now + debt, '%d%03d' of its microseconds and ticks. It
-- sets vals and ttl as put would, without the call: it runs per decision.
local function tb_write(ki, denom, debt)
  if debt <= 0 then
    put(ki, false)
    return
  end
  local ticks = debt % denom
  tus[ki], tks[ki] = now + (debt - ticks) / denom, ticks
  vals[ki], ttl[ki] = true, ceil_div(debt, denom * 1000)
end

--@check
-- res: the reserve, in ticks, that the request must leave in the bucket.
local cap, res = p3 * p2, auxn
local over
r1, over = tb_debt(ki, p1, cap)
if cost > p3 or cost * p2 + res > cap then
  flag, r2 = NEVER, r1
else
  r2 = r1 + cost * p2
  if r2 + res <= cap then flag = ADMIT else flag = DENY end
  -- Soft shed: a request that leaves the debt past the threshold at waits
  -- the time the rate takes to refill the excess (r2 - at ticks, in
  -- microseconds rounded up), at most R_SHED_DELAY (limiter/softshed.go).
  local at = rule[R_SHED_AT]
  if flag == ADMIT and cost > 0 and r2 > at and rule[R_SHED_DELAY] > 0 then
    r4 = min(rule[R_SHED_DELAY], ceil_div(r2 - at, p1))
  end
end
if over and over > 0 and flag ~= ADMIT then r3 = over end

--@run
-- reps requests of the same cost at once: the first fits of them are
-- admitted, each owing what those before it took (and shed as that debt
-- says); the rest see the debt they left.
local cap, res, step = p3 * p2, auxn, cost * p2
local debt, over = tb_debt(ki, p1, cap)
local fits, deny = 0, NEVER
if cost <= p3 and step + res <= cap then
  fits, deny = max(0, min(reps, floor((cap - res - debt) / step))), DENY
end
local at, shed = rule[R_SHED_AT], rule[R_SHED_DELAY]
for r = 0, reps - 1 do
  local q = o + r * (1 + ZONE_REPLY) -- request r's reply: its time, then its zone's
  if r < fits then
    local before, delay = debt + r * step, 0
    if before + step > at and shed > 0 then delay = min(shed, ceil_div(before + step - at, p1)) end
    reply[q], reply[q + Z_FLAG], reply[q + Z_R1], reply[q + Z_R2], reply[q + Z_R3], reply[q + Z_DELAY] = now, ADMIT, before, before + step, 0, delay
  else
    local before = debt + fits * step
    local after = before + step
    if deny == NEVER then after = before end
    reply[q], reply[q + Z_FLAG], reply[q + Z_R1], reply[q + Z_R2], reply[q + Z_R3], reply[q + Z_DELAY] = -now, deny, before, after, 0, 0
    if over and over > 0 then reply[q + Z_R3] = over end
  end
end
if fits > 0 then tb_write(ki, p1, debt + fits * step) end
ran = true

--@commit
-- Prefetch (rule[R_PREFETCH] tokens a call may take): spares beyond the cost, at
-- most a quarter of what the bucket holds after it (and its reserve), so
-- that a bucket with fewer than 4 tokens left gives none (see
-- limiter/prefetch.go). Reported as r3, with r2 the debt after them.
if rule[R_PREFETCH] > cost then
  local sp = min(rule[R_PREFETCH] - cost, floor(floor((p3 * p2 - r2 - auxn) / p2) / 4))
  if sp > 0 then
    r2 = r2 + sp * p2
    reply[c + Z_R2], reply[c + Z_R3] = r2, sp
  end
end
tb_write(ki, p1, r2)

--@refund
if auxn < CHARGE then -- a charge of CHARGE - auxn ticks, debt beyond capacity allowed
  tb_write(ki, p1, min(tb_debt(ki, p1, MAX_DEBT) + CHARGE - auxn, MAX_DEBT))
else -- from the whole debt: a settlement's refund forgives none of a debt beyond capacity
  tb_write(ki, p1, tb_debt(ki, p1, MAX_DEBT) - cost * p2)
end
