-- quota.lua: at most limit per calendar period (a day, a week from Monday,
-- a month, in the zone's time zone), the count starting afresh at each
-- period's first instant. Redis cannot read a calendar, so the node sends
-- the first instants of three consecutive periods around its own time, and
-- the script decides in the one of [p1, p2) and [p2, p3) that holds Redis'
-- TIME: every node decides on the same period however its clock is off,
-- up to half a period (beyond, the zone gets an error and its on_error
-- applies). The state is the period's count times 1024 plus a tag of the
-- period (its first minute modulo 1024), and the key expires at the
-- period's end. See limiter/quota.go.
--
-- Parameters: p1, p2, p3 the three periods' first instants (us), p4 the
-- limit; aux the reserve (requests).
-- Reports: flag, the period's count before the request, microseconds until
-- the period ends, the period's length (us).

--@helpers
-- quota_at returns the period of [p1, p2) and [p2, p3) that holds now
-- (nil when neither does): its first instant and the next's, its tag (its
-- first minute modulo 1024), the count the bucket holds for it, and
-- whether the bucket holds a count of that period at all.
local function quota_at(ki, p1, p2, p3)
  local s, e = p2, p3
  if now < p2 then s, e = p1, p2 end
  if now < s or now >= e then return nil end
  local tag = floor(s / 60000000) % 1024
  local v = tonumber(get(ki) or -1) or -1
  if v < 0 or v % 1024 ~= tag then return s, e, tag, 0, false end
  return s, e, tag, floor(v / 1024), true
end

--@check
local s, e, _, used = quota_at(ki, p1, p2, p3)
if not s then
  error({err = "quota: this node's clock and Redis TIME are half a period or more apart"})
end
r1, r2, r3 = used, e - now, e - s
if cost + auxn > p4 then flag = NEVER elseif r1 + cost + auxn <= p4 then flag = ADMIT else flag = DENY end

--@commit
-- The key expires at the period's end.
put(ki, (r1 + cost) * 1024 + floor((now + r2 - r3) / 60000000) % 1024, ceil_div(r2, 1000))

--@refund
-- Only the period that counted the charge (aux: its time) gives it back. A
-- settlement's charge (aux CHARGE - n: n requests' worth, cost_header)
-- counts in the period it lands in, the count at most twice the limit.
--
-- An outage's charge (aux SEED - seed, cost 1 + n) counts only in the
-- period of its seed (the count a node last heard, times 1024, plus the
-- period's tag): the count rises to at least the seed's, then takes the n
-- requests the node's local quota admitted, at most twice the limit. A
-- count Redis no longer holds (it restarted empty) is rebuilt by the
-- nodes' charges in any order: <key>!rebuilt ("added:end") keeps, for
-- REBUILT_MS from the last charge, what the charges added since, and a
-- seed raises the rest of the count only. Its end is in the script's
-- time (the key's TTL only collects it), as the ban's denials are.
local s, e, tag, used, held = quota_at(ki, p1, p2, p3)
if s and auxn <= SEED then
  local seed = SEED - auxn
  if seed % 1024 == tag then
    local rk = key .. '!rebuilt'
    local added
    if held then
      local m = call('GET', rk)
      if m then
        local a, till = match(m, '^(%d+):(%d+)$')
        if a and tonumber(till) > now then added = tonumber(a) end
      end
    else
      used, added = 0, 0
    end
    local count = min(max(used - (added or 0), floor(seed / 1024)) + (added or 0) + cost - 1, 2 * p4)
    put(ki, count * 1024 + tag, ceil_div(e - now, 1000))
    if added then
      local till = min(now + REBUILT_MS * 1000, e)
      call('SET', rk, format('%d:%d', min(added + cost - 1, count), till), 'PX', digits(ceil_div(till - now, 1000)))
    end
  end
elseif s and auxn < CHARGE then
  put(ki, min(used + CHARGE - auxn, 2 * p4) * 1024 + tag, ceil_div(e - now, 1000))
elseif s and auxn >= s and auxn < e and used > 0 then
  put(ki, max(0, used - cost) * 1024 + tag, ceil_div(e - now, 1000))
end
