-- decide.lua: one request against every zone's bucket, atomically. Every
-- zone is checked first; only if all admit is each one charged, so a
-- denied request costs no zone anything.
--
-- KEYS[i]              the bucket of zone i
-- ARGV[1]              "0": the clock is Redis TIME; otherwise a fixed time
--                      in microseconds, for tests only
-- ARGV[2+6(i-1)...]    per zone i: algorithm (0 token bucket, 1 sliding
--                      window, 2 fixed window, 3 sliding log, 4 leaky
--                      bucket), four parameters p1..p4, cost
--
-- Returns {admitted (1|0), then four numbers per zone: flag (1 admits, 0
-- denies, 2 never can) and three the zone's algorithm reports (r1..r3)}.

local n = #KEYS
local reply = {1}
for i = 1, n do
  local a = 2 + (i - 1) * 6
  local alg = tonumber(ARGV[a])
  local p1, p2, p3, p4 = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local cost = tonumber(ARGV[a + 5])
  local key = KEYS[i]
  local flag, r1, r2, r3 = 0, 0, 0, 0
  --@dispatch check
  if flag ~= 1 then reply[1] = 0 end
  local b = 1 + (i - 1) * 4
  reply[b + 1], reply[b + 2], reply[b + 3], reply[b + 4] = flag, r1, r2, r3
end
if reply[1] == 0 then return reply end
for i = 1, n do
  local a = 2 + (i - 1) * 6
  local cost = tonumber(ARGV[a + 5])
  if cost > 0 then
    local alg = tonumber(ARGV[a])
    local p1, p2, p3, p4 = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    local key = KEYS[i]
    local b = 1 + (i - 1) * 4
    local r1, r2, r3 = reply[b + 2], reply[b + 3], reply[b + 4]
    --@dispatch commit
  end
end
return reply
