-- sliding_window.lua: at most limit per sliding window, estimated from two
-- fixed windows: the previous window's count weighted by the share of it
-- the sliding window still covers (in whole milliseconds, rounded in the
-- strict direction), plus the current window's count. State as in
-- fixed_window.lua, with both counters. See limiter/windows.go.
--
-- Parameters: p1 window (us), p2 limit; aux the reserve (requests).
-- Reports: flag, previous window's count, current window's count,
-- microseconds into the current window.

--@check
local res = auxn
r1, r2, r3 = win_unpack(ki, p1)
if cost + res > p2 then
  flag = NEVER
else
  local wms = floor(p1 / 1000)
  local ems = floor(r3 / 1000)
  if r1 * (wms - ems) + (r2 + cost + res) * wms <= p2 * wms then flag = ADMIT else flag = DENY end
end

--@commit
win_write(ki, floor(now / p1), r1, r2 + cost, 2 * p1 - r3)

--@refund
-- The charge (made at aux) is given back to the window that counts it:
-- the current one, or the previous one if the window turned since.
local prev, curr, elapsed, w = win_unpack(ki, p1)
local aw = floor(auxn / p1)
if aw == w and curr > 0 then
  win_write(ki, w, prev, max(0, curr - cost), 2 * p1 - elapsed)
elseif aw == w - 1 and prev > 0 then
  win_write(ki, w, max(0, prev - cost), curr, 2 * p1 - elapsed)
end
