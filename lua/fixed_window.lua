-- fixed_window.lua: at most limit per window, the windows aligned to Redis
-- time. The state packs the window's index modulo 1024 and its count (21
-- bits), so a key that outlives its window by a millisecond of TTL still
-- counts nothing in the next one. See limiter/windows.go.
--
-- Parameters: p1 window (us), p2 limit; aux the reserve (requests).
-- Reports: flag, count in the current window, microseconds into it, 0.

--@helpers
local W_BITS = 2097152 -- 2^21: one counter

-- win_unpack returns a window state's counts as seen now: the previous
-- window's, the current one's, the microseconds into the current window,
-- and the current window's index.
local function win_unpack(ki, window)
  local w = floor(now / window)
  local elapsed = now - w * window
  local v = vals[ki]
  if v == true then v = get(ki) end -- a token bucket's time, as stored
  if not v then return 0, 0, elapsed, w end
  v = tonumber(v) -- a number already when this call put it
  -- A token or leaky bucket's state (a time x 1000, far above any packed
  -- counters): the zone changed algorithm; start afresh.
  if v >= 4503599627370496 then return 0, 0, elapsed, w end -- 2^52
  local idx = floor(v / (W_BITS * W_BITS))
  local prev = floor(v / W_BITS) % W_BITS
  local curr = v % W_BITS
  if idx == w % 1024 then return prev, curr, elapsed, w end
  if idx == (w - 1) % 1024 then return curr, 0, elapsed, w end
  return 0, 0, elapsed, w
end

-- win_write stores (puts) a window state: the packed counters, as a number
-- until flush writes it ('%d').
local function win_write(ki, w, prev, curr, ttl_us)
  put(ki, ((w % 1024) * W_BITS + prev) * W_BITS + curr, ceil_div(ttl_us, 1000))
end

--@check
local _
local res = auxn -- the requests the request must leave
_, r1, r2 = win_unpack(ki, p1)
if cost + res > p2 then flag = NEVER elseif r1 + cost + res <= p2 then flag = ADMIT else flag = DENY end

--@commit
-- Prefetch: as the token bucket's (token_bucket.lua), reported as r3.
local sp = 0
if rule[R_PREFETCH] > cost then
  sp = max(0, min(rule[R_PREFETCH] - cost, floor((p2 - r1 - cost - auxn) / 4)))
  reply[c + Z_R3] = sp
end
win_write(ki, floor(now / p1), 0, r1 + cost + sp, p1 - r2)

--@refund
-- Only the window that counted the charge (aux: its time) gives it back.
local _, curr, elapsed, w = win_unpack(ki, p1)
if curr > 0 and floor(auxn / p1) == w then
  win_write(ki, w, 0, max(0, curr - cost), p1 - elapsed)
end
