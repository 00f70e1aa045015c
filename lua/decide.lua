-- decide.lua: one request against every zone's bucket, atomically. Every
-- zone is checked first; only if all admit is each one charged, so a
-- denied request costs no zone anything.
--
-- KEYS[i]              the bucket of zone i
-- ARGV[1]              "0": the clock is Redis TIME; otherwise a fixed time
--                      in microseconds, for tests only
-- ARGV[2+6(i-1)...]    per zone i: algorithm (0 token bucket, 1 sliding
--                      window, 2 fixed window, 3 sliding log, 4 leaky
--                      bucket), four parameters, cost
--
-- Returns {admitted (1|0), then four numbers per zone: flag (1 admits, 0
-- denies, 2 never can) and three the zone's algorithm reports}.

local now = clock()
local n = #KEYS
local reply = {1}
local checks, params = {}, {}
local admit = true
for i = 1, n do
  local a = 2 + (i - 1) * 6
  local alg = ALG[tonumber(ARGV[a])]
  local p = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])}
  local cost = tonumber(ARGV[a + 5])
  local v = alg.check(KEYS[i], p, cost, now)
  if v[1] ~= 1 then admit = false end
  checks[i], params[i] = v, p
  for j = 1, 4 do reply[1 + (i - 1) * 4 + j] = v[j] end
end
if not admit then
  reply[1] = 0
  return reply
end
for i = 1, n do
  local a = 2 + (i - 1) * 6
  local cost = tonumber(ARGV[a + 5])
  if cost > 0 then
    ALG[tonumber(ARGV[a])].commit(KEYS[i], params[i], cost, now, checks[i])
  end
end
return reply
