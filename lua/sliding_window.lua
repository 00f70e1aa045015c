-- sliding_window.lua: at most limit per sliding window, estimated from two
-- fixed windows: the previous window's count weighted by the share of it
-- the sliding window still covers (in whole milliseconds, rounded in the
-- strict direction), plus the current window's count. State as in
-- fixed_window.lua, with both counters. See limiter/windows.go.
--
-- Parameters: p1 window (us), p2 limit.
-- Reply: flag, previous window's count, current window's count, microseconds
-- into the current window.

ALG[1] = {
  check = function(key, p, cost, now)
    local window, limit = p[1], p[2]
    local prev, curr, elapsed = win_unpack(key, window, now)
    if cost > limit then return {2, prev, curr, elapsed} end
    local wms = math.floor(window / 1000)
    local ems = math.floor(elapsed / 1000)
    if prev * (wms - ems) + (curr + cost) * wms <= limit * wms then
      return {1, prev, curr, elapsed}
    end
    return {0, prev, curr, elapsed}
  end,
  commit = function(key, p, cost, now, v)
    local window = p[1]
    local w = math.floor(now / window)
    redis.call('SET', key, win_pack(w, v[2], v[3] + cost), 'PX', ceil_div(2 * window - v[4], 1000))
  end,
  refund = function(key, p, cost, now)
    local window = p[1]
    local prev, curr, elapsed, w = win_unpack(key, window, now)
    if curr > 0 then
      redis.call('SET', key, win_pack(w, prev, math.max(0, curr - cost)), 'PX', ceil_div(2 * window - elapsed, 1000))
    end
  end,
}
