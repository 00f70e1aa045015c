-- fixed_window.lua: at most limit per window, the windows aligned to Redis
-- time. The state packs the window's index modulo 1024 and its count (21
-- bits), so a key that outlives its window by a millisecond of TTL still
-- counts nothing in the next one. See limiter/windows.go.
--
-- Parameters: p1 window (us), p2 limit.
-- Reply: flag, count in the current window, microseconds into it, 0.

local W_BITS = 2097152 -- 2^21: one counter
local function win_unpack(key, window, now)
  local w = math.floor(now / window)
  local elapsed = now - w * window
  local v = get_int(key)
  if not v then return 0, 0, elapsed, w end
  v = tonumber(v)
  local idx = math.floor(v / (W_BITS * W_BITS))
  local prev = math.floor(v / W_BITS) % W_BITS
  local curr = v % W_BITS
  if idx == w % 1024 then return prev, curr, elapsed, w end
  if idx == (w - 1) % 1024 then return curr, 0, elapsed, w end
  return 0, 0, elapsed, w
end

local function win_pack(w, prev, curr)
  return string.format('%d', ((w % 1024) * W_BITS + prev) * W_BITS + curr)
end

ALG[2] = {
  check = function(key, p, cost, now)
    local window, limit = p[1], p[2]
    local _, curr, elapsed = win_unpack(key, window, now)
    if cost > limit then return {2, curr, elapsed, 0} end
    if curr + cost <= limit then return {1, curr, elapsed, 0} end
    return {0, curr, elapsed, 0}
  end,
  commit = function(key, p, cost, now, v)
    local window = p[1]
    local w = math.floor(now / window)
    redis.call('SET', key, win_pack(w, 0, v[2] + cost), 'PX', ceil_div(window - v[3], 1000))
  end,
  refund = function(key, p, cost, now)
    local window = p[1]
    local _, curr, elapsed, w = win_unpack(key, window, now)
    if curr > 0 then
      redis.call('SET', key, win_pack(w, 0, math.max(0, curr - cost)), 'PX', ceil_div(window - elapsed, 1000))
    end
  end,
}
