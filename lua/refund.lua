-- refund.lua: gives back what decide.lua charged, for a request that a
-- Redis Cluster decided in several calls (one per slot) and that a zone on
-- another slot denied. Arguments as decide.lua's. Returns the number of
-- zones refunded.

local now = clock()
local refunded = 0
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 6
  local p = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])}
  local cost = tonumber(ARGV[a + 5])
  if cost > 0 then
    ALG[tonumber(ARGV[a])].refund(KEYS[i], p, cost, now)
    refunded = refunded + 1
  end
end
return refunded
