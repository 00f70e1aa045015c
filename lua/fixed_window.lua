-- fixed_window.lua: at most limit per window, the windows aligned to Redis
-- time. The state packs the window's index modulo 1024 and its count (21
-- bits), so a key that outlives its window by a millisecond of TTL still
-- counts nothing in the next one. A count above 2^21 - 1 is kept wide: the
-- negative of the index times 2^42 plus the count (every other state is
-- positive). See limiter/windows.go.
--
-- Parameters: p1 window (us), p2 limit; aux the reserve (requests).
-- Reports: flag, count in the current window, microseconds into it, 0.

--@helpers
local W_BITS = 2097152 -- 2^21: one counter
local WIDE = 4398046511104 -- 2^42: a wide state's count

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

-- fw_unpack returns a fixed window's count as seen now, the microseconds
-- into the window, and the window's index: from a wide state, or as
-- win_unpack reads the packed counters.
local function fw_unpack(ki, window)
  local v = vals[ki]
  if type(v) == 'string' then v = tonumber(v) end
  if type(v) ~= 'number' or v >= 0 then
    local _, curr, elapsed, w = win_unpack(ki, window)
    return curr, elapsed, w
  end
  local w = floor(now / window)
  if floor(-v / WIDE) ~= w % 1024 then return 0, now - w * window, w end
  return -v % WIDE, now - w * window, w
end

-- fw_write stores (puts) a fixed window's count: packed while it fits 21
-- bits, else wide.
local function fw_write(ki, w, count, ttl_us)
  if count < W_BITS then
    win_write(ki, w, 0, count, ttl_us)
  else
    put(ki, -((w % 1024) * WIDE + count), ceil_div(ttl_us, 1000))
  end
end

--@check
local res = auxn -- the requests the request must leave
r1, r2 = fw_unpack(ki, p1)
if cost + res > p2 then flag = NEVER elseif r1 + cost + res <= p2 then flag = ADMIT else flag = DENY end

--@run
-- reps requests of the same cost at once: the first fits of them are
-- admitted, each counting what those before it charged; the rest see the
-- count they left (cost + res > p2: none is ever admissible).
local res = auxn
local count, elapsed, w = fw_unpack(ki, p1)
local fits, deny = 0, NEVER
if cost + res <= p2 then
  fits, deny = max(0, min(reps, floor((p2 - res - count) / cost))), DENY
end
for r = 0, reps - 1 do
  local q = o + r * (1 + ZONE_REPLY) -- request r's reply: its time, then its zone's
  if r < fits then
    reply[q], reply[q + Z_FLAG], reply[q + Z_R1] = now, ADMIT, count + r * cost
  else
    reply[q], reply[q + Z_FLAG], reply[q + Z_R1] = -now, deny, count + fits * cost
  end
  reply[q + Z_R2], reply[q + Z_R3], reply[q + Z_DELAY] = elapsed, 0, 0
end
if fits > 0 then fw_write(ki, w, count + fits * cost, p1 - elapsed) end
ran = true

--@commit
-- Prefetch: as the token bucket's (token_bucket.lua), reported as r3.
local sp = 0
if rule[R_PREFETCH] > cost then
  sp = max(0, min(rule[R_PREFETCH] - cost, floor((p2 - r1 - cost - auxn) / 4)))
  reply[c + Z_R3] = sp
end
fw_write(ki, floor(now / p1), r1 + cost + sp, p1 - r2)

--@refund
-- Only the window that counted the charge (aux: its time) gives it back.
local curr, elapsed, w = fw_unpack(ki, p1)
if curr > 0 and floor(auxn / p1) == w then
  fw_write(ki, w, max(0, curr - cost), p1 - elapsed)
end
