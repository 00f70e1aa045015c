-- peek.lua: what each zone's bucket holds for a client key, read without
-- writing anything: no command of this script changes a key, and no
-- decision is charged (the admin API's GET /rate_limit/keys). It takes
-- decide.lua's arguments (lua/wire.go), each zone a request of its own
-- with cost 0, and runs each algorithm's peek section, or its check
-- section where the check reads only (the token and leaky buckets and the
-- windows: a check of cost 0 admits and writes nothing).
--
-- Returns the time (us), then PEEK_ZONE numbers per zone, in order: its
-- flag and the three values its algorithm reports (Z_FLAG .. Z_R3, as a
-- decision of cost 0 would report them), the delay (Z_DELAY: 0, as for a
-- request of cost 0), then, for a zone with a ban, the
-- ban's microseconds left (P_BAN_LEFT, 0 for none) and the denials that
-- started it (P_BAN_DENIALS), and the denials counted towards the next ban
-- (P_DENIALS).

local reply = {now}
local a, o = zones, 2
while a <= zones_end do
  local z = tonumber(ARGV[a])
  local ki, k, last
  --@unzone
  a = a + 1
  local rule, cost, aux, auxn = krule[k], kcost[k], kaux[k], kauxn[k]
  local alg, p1, p2, p3, p4 = rule[R_ALG], rule[R_P1], rule[R_P2], rule[R_P3], rule[R_P4]
  local key = KEYS[ki]
  local flag, r1, r2, r3, r4 = DENY, 0, 0, 0, 0
  --@dispatch peek
  local bl, bd, dn = 0, 0, 0
  if rule[R_BAN] > 0 then
    local b = call('GET', key .. '!ban')
    if b then
      local e, n = match(b, '^(%d+):%d+:(%d+)$')
      e = tonumber(e)
      if e and e > now then bl, bd = e - now, tonumber(n) end
    end
    local d = call('GET', key .. '!den')
    if d then
      local n, e = match(d, '^(%d+):(%d+)$')
      e = tonumber(e)
      if e and e > now then dn = tonumber(n) end
    end
  end
  local c = o - 1 -- the zone's values are reply[c + Z_FLAG] ..
  reply[c + Z_FLAG], reply[c + Z_R1], reply[c + Z_R2], reply[c + Z_R3], reply[c + Z_DELAY] = flag, r1, r2, r3, r4
  reply[c + P_BAN_LEFT], reply[c + P_BAN_DENIALS], reply[c + P_DENIALS] = bl, bd, dn
  o = o + PEEK_ZONE
end
return reply
