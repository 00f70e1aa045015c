-- refund.lua: gives back what decide.lua charged: for a request that a
-- Redis Cluster decided in several calls (one per slot) and that a zone on
-- another slot denied, for a response that a zone does not count
-- (count_status), and to free a concurrency zone's slot when its request
-- ends. Arguments as decide.lua's for a batch of one request, except that
-- each zone's aux is the time (us) decide.lua reported for the charge (the
-- windows give back only what that window still counts), or the slot's id
-- (concurrency). Returns the number of zones refunded.

local refunded = 0
for a = zones, zones_end do
  local z = tonumber(ARGV[a])
  if z ~= NO_ZONES then
    local ki, k, last
    --@unzone
    local rule, cost, aux, auxn = krule[k], kcost[k], kaux[k], kauxn[k]
    if cost > 0 then
      local alg, p1, p2, p3, p4 = rule[R_ALG], rule[R_P1], rule[R_P2], rule[R_P3], rule[R_P4]
      local key = KEYS[ki]
      --@dispatch refund
      refunded = refunded + 1
    end
  end
end
flush()
return refunded
