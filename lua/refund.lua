-- refund.lua: gives back what decide.lua charged, for a request that a
-- Redis Cluster decided in several calls (one per slot) and that a zone on
-- another slot denied. Arguments as decide.lua's for a batch of one
-- request: ARGV[1] the clock, ARGV[2] the number of zones, then six per
-- zone. Returns the number of zones refunded.

local refunded = 0
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local cost = tonumber(ARGV[a + 5])
  if cost > 0 then
    local alg = tonumber(ARGV[a])
    local p1, p2, p3, p4 = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    local key = KEYS[i]
    --@dispatch refund
    refunded = refunded + 1
  end
end
return refunded
