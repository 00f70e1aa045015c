-- decide.lua: a batch of requests, each against every one of its zones'
-- buckets, in one call. The nodes send every decision that is waiting
-- when a round trip leaves as one call, so that Redis pays for a script
-- call, TIME and the reply once per batch rather than once per request,
-- and reads and writes a bucket that several of them use once. Requests
-- are decided one after the other, as separate calls in a pipeline would
-- be, and the whole batch is atomic. Within a request every zone is
-- checked first; only if all admit is each one charged, so a denied
-- request costs no zone anything. A dry-run zone is checked and charged
-- like the others when it admits, but what it would deny does not deny
-- the request (and is not charged).
--
-- The arguments and the reply, position by position, are declared in
-- lua/wire.go (which lists them at the top of the assembled script):
-- ARGV[ARG_CLOCK] "0": the clock is Redis TIME; otherwise a fixed time
--                  in microseconds, for tests only
-- ARGV[ARG_RULES]  the number of rules, then RULE_ARGS arguments per rule:
--                  its algorithm (R_ALG), four parameters p1..p4 (R_P1 ..
--                  R_P4), its flags (R_FLAGS: F_DRY_RUN), its ban
--                  (R_BAN: duration in us, 0 for none; R_BAN_DENIALS;
--                  R_BAN_WINDOW in us), its prefetch (R_PREFETCH: the
--                  most tokens an admitted request may take, its cost and
--                  spares; token bucket and fixed window, 0 for none), and
--                  its soft shed (token bucket: R_SHED_AT, the debt in
--                  ticks past which an admitted request is delayed, and
--                  R_SHED_DELAY, the longest delay in us, 0 for none)
-- then per request one argument per zone, in order: the zone's bucket
--                  (ki, its index in KEYS), kind (k, see below) and
--                  whether it is the request's last zone, as one number
--                  (see zone.lua); a request of no zones is one argument,
--                  NO_ZONES. An argument -r below NO_ZONES stands for r
--                  identical requests of one zone each, whose zone follows
--                  it (a run)
-- then             KIND_ARGS arguments per zone kind: the index of its
--                  rule (K_RULE, from 1), its cost (K_COST), and aux
--                  (K_AUX): the reserve the request must leave (the rate
--                  algorithms, in the algorithm's units) or the slot's id
--                  (concurrency). Zones that share all three may share a
--                  kind.
-- ARGV[#ARGV]      the number of zone kinds
-- KEYS             the buckets of the batch, each once. A zone with a ban
--                  also uses <bucket>!ban ("end:start:denials") and
--                  <bucket>!den ("denials:end"), in the bucket's Cluster
--                  slot (the hash tag is the bucket's).
--
-- Returns, request after request, {the time (us) if the request is
-- admitted, minus the time if it is denied, then ZONE_REPLY numbers per
-- zone: its flag (Z_FLAG), three the zone's algorithm reports (Z_R1 ..
-- Z_R3) and the delay (Z_DELAY, us) an admitted request waits before it
-- is passed on (a token bucket's soft shed; else 0)}, all in one flat
-- array. The flag is ADMIT, DENY, NEVER (no wait
-- makes the request admissible) or BANNED (r1 the microseconds the ban has
-- left, r2 its denials), plus BAN_STARTED when this denial started a ban.
-- A request whose commands fail (a key of the wrong type, say) gets its
-- error in place of the time, then zeros; the requests around it are
-- decided as usual.

local reply = {}
local zbucket, zkind = {}, {} -- the current request's zones: ki and kind

-- banned returns the microseconds the ban of the bucket at key has left,
-- and the denials that started it, or nil.
local function banned(key)
  local b = call('GET', key .. '!ban')
  if not b then return nil end
  local e, n = match(b, '^(%d+):%d+:(%d+)$')
  e = tonumber(e)
  if not e or e <= now then return nil end
  return e - now, tonumber(n)
end

-- denied counts a denial of the bucket at key under rule, and starts its
-- ban (only reports it, in a dry run) when it is the rule's n-th within
-- its window. It returns BAN_STARTED when a ban started, else 0. The
-- count is kept as "denials:end" (the end of its window, in the script's
-- time): the key's TTL only collects it, so that the window is counted on
-- the same clock as everything else (and as limiter/membans.go counts it).
local function denied(key, rule)
  local dk = key .. '!den'
  local n, e = 0, now + rule[R_BAN_WINDOW]
  local d = call('GET', dk)
  if d then
    local dn, de = match(d, '^(%d+):(%d+)$')
    dn, de = tonumber(dn), tonumber(de)
    if dn and de and de > now then n, e = dn, de end
  end
  n = n + 1
  if n < rule[R_BAN_DENIALS] then
    call('SET', dk, format('%d:%d', n, e), 'PX', digits(ceil_div(e - now, 1000)))
    return 0
  end
  call('DEL', dk)
  if rule[R_FLAGS] % (2 * F_DRY_RUN) < F_DRY_RUN then -- not a dry run
    call('SET', key .. '!ban', format('%d:%d:%d', now + rule[R_BAN], now, n), 'PX', digits(ceil_div(rule[R_BAN], 1000)))
  end
  return BAN_STARTED
end

-- one decides the request of n zones (their buckets and kinds in
-- zbucket and zkind from 0), with its reply from reply[o]. A function so
-- that pcall can confine a failing request's error to that request.
local function one(n, o)
  reply[o] = now
  for i = 0, n - 1 do
    local ki, k = zbucket[i], zkind[i]
    local rule, cost, aux, auxn = krule[k], kcost[k], kaux[k], kauxn[k]
    local alg, p1, p2, p3, p4 = rule[R_ALG], rule[R_P1], rule[R_P2], rule[R_P3], rule[R_P4]
    local key = KEYS[ki]
    local flag, r1, r2, r3, r4 = DENY, 0, 0, 0, 0
    local left, bn
    if rule[R_BAN] > 0 then left, bn = banned(key) end
    if left then
      flag, r1, r2 = BANNED, left, bn
    else
      --@dispatch check
      if flag ~= ADMIT and rule[R_BAN] > 0 then flag = flag + denied(key, rule) end
    end
    if flag ~= ADMIT and rule[R_FLAGS] % (2 * F_DRY_RUN) < F_DRY_RUN then reply[o] = -now end
    local c = o + i * ZONE_REPLY -- zone i's values are reply[c + Z_FLAG] ..
    reply[c + Z_FLAG], reply[c + Z_R1], reply[c + Z_R2], reply[c + Z_R3], reply[c + Z_DELAY] = flag, r1, r2, r3, r4
    if n == 1 then
      -- A request of one zone (most are) is charged here, with what the
      -- check left at hand: the loop below would look it all up again.
      if flag == ADMIT and cost > 0 then
        --@dispatch commit
      end
      return
    end
  end
  if reply[o] < 0 then return end
  for i = 0, n - 1 do
    local ki, k = zbucket[i], zkind[i]
    local cost = kcost[k]
    local c = o + i * ZONE_REPLY
    if cost > 0 and reply[c + Z_FLAG] == ADMIT then
      local rule, aux, auxn = krule[k], kaux[k], kauxn[k]
      local alg, p1, p2, p3, p4 = rule[R_ALG], rule[R_P1], rule[R_P2], rule[R_P3], rule[R_P4]
      local key = KEYS[ki]
      local r1, r2, r3 = reply[c + Z_R1], reply[c + Z_R2], reply[c + Z_R3]
      --@dispatch commit
    end
  end
end

-- failed puts a request's error in place of its time in its reply, from
-- reply[o], and zeros for its n zones: its commands failed (see one).
local function failed(err, n, o)
  if type(err) ~= 'table' then err = {err = tostring(err)} end
  reply[o] = err
  for j = o + 1, o + ZONE_REPLY * n do reply[j] = 0 end
end

-- run decides reps identical requests of one zone each (a run: see
-- RunOf), the first with its reply from reply[o], the others after it. Where the zone's algorithm has a run section and only
-- the bucket's count decides (no ban, dry run or prefetch, a cost), the
-- section decides the whole run at once and sets ran; otherwise each
-- request is decided in turn. Either way each gets the reply it would
-- have had alone.
local function run(reps, o)
  local ki, k = zbucket[0], zkind[0]
  local rule, cost, auxn = krule[k], kcost[k], kauxn[k]
  local alg, p1, p2, p3 = rule[R_ALG], rule[R_P1], rule[R_P2], rule[R_P3]
  local ran = false
  if cost > 0 and rule[R_BAN] == 0 and rule[R_PREFETCH] <= cost and rule[R_FLAGS] % (2 * F_DRY_RUN) < F_DRY_RUN then
    --@dispatch run
  end
  if not ran then
    for r = 0, reps - 1 do
      local q = o + r * (1 + ZONE_REPLY)
      local ok, err = pcall(one, 1, q)
      if not ok then failed(err, 1, q) end
    end
  end
end

local a, o = zones, 1
while a <= zones_end do
  local n, z = 0, tonumber(ARGV[a])
  local reps = 1
  if z < NO_ZONES then -- a run of -z requests: its zone follows
    reps, a = -z, a + 1
    z = tonumber(ARGV[a])
  end
  if z == NO_ZONES then
    a = a + 1
  else
    repeat
      local ki, k, last
      --@unzone
      zbucket[n], zkind[n] = ki, k
      n = n + 1
      if last == 1 then break end
      z = tonumber(ARGV[a + n])
    until false
    a = a + n
  end
  if reps > 1 then
    run(reps, o)
  else
    local ok, err = pcall(one, n, o)
    if not ok then failed(err, n, o) end
  end
  o = o + reps * (1 + ZONE_REPLY * n) -- the time, then the zones, per request
end
flush()
return reply
