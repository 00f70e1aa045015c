-- refund.lua: gives back what decide.lua charged: for a request that a
-- Redis Cluster decided in several calls (one per slot) and that a zone on
-- another slot denied, for a response that a zone does not count
-- (count_status), and to free a concurrency zone's slot when its request
-- ends. Arguments as decide.lua's for a batch of one request, except that
-- each zone's aux is the time (us) decide.lua reported for the charge (the
-- windows give back only what that window still counts), or the slot's id
-- (concurrency). Returns the number of zones refunded.

local nrules = tonumber(ARGV[2])
local refunded = 0
local a = 3 + 10 * nrules -- the number of zones
for i = 1, tonumber(ARGV[a]) do
  local b = a + 1 + (i - 1) * 4
  local cost = tonumber(ARGV[b + 2])
  if cost > 0 then
    local r = 3 + (tonumber(ARGV[b]) - 1) * 10
    local alg = tonumber(ARGV[r])
    local p1, p2, p3, p4 = tonumber(ARGV[r + 1]), tonumber(ARGV[r + 2]), tonumber(ARGV[r + 3]), tonumber(ARGV[r + 4])
    local ki, aux = tonumber(ARGV[b + 1]), ARGV[b + 3]
    local key = KEYS[ki]
    --@dispatch refund
    refunded = refunded + 1
  end
end
flush()
return refunded
