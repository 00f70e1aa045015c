-- decide.lua: a batch of requests, each against every one of its zones'
-- buckets, in one call. The nodes send every decision that is waiting
-- when a round trip leaves as one call, so that Redis pays for a script
-- call, TIME and the reply once per batch rather than once per request,
-- and reads and writes a bucket that several of them use once. Requests
-- are decided one after the other, as separate calls in a pipeline would
-- be, and the whole batch is atomic. Within a request every zone is
-- checked first; only if all admit is each one charged, so a denied
-- request costs no zone anything.
--
-- ARGV[1]          "0": the clock is Redis TIME; otherwise a fixed time in
--                  microseconds, for tests only
-- ARGV[2]          the number of rules, then five arguments per rule: its
--                  algorithm (0 token bucket, 1 sliding window, 2 fixed
--                  window, 3 sliding log, 4 leaky bucket) and four
--                  parameters p1..p4
-- then per request its number of zones n, then per zone the index of its
--                  rule, the index of its bucket in KEYS (both from 1) and
--                  its cost
-- KEYS             the buckets of the batch, each once
--
-- Returns, request after request, {admitted (1|0), then four numbers per
-- zone: flag (1 admits, 0 denies, 2 never can) and three the zone's
-- algorithm reports (r1..r3)}, all in one flat array. A request whose
-- commands fail (a key of the wrong type, say) gets its error in place of
-- admitted, then zeros; the requests around it are decided as usual.

local nrules = tonumber(ARGV[2])
local rules = {}
for i = 1, nrules do
  local b = 3 + (i - 1) * 5
  rules[i] = {tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])}
end

local reply = {}
local zrule, zbucket, zcost = {}, {}, {} -- the current request's zones

-- one decides the request of n zones whose arguments start at ARGV[a],
-- with its reply from reply[o]. A function so that pcall can confine a
-- failing request's error to that request.
local function one(n, a, o)
  reply[o] = 1
  for i = 0, n - 1 do
    local b = a + 3 * i
    local rule, ki, cost = rules[tonumber(ARGV[b])], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    zrule[i], zbucket[i], zcost[i] = rule, ki, cost
    local alg, p1, p2, p3, p4 = rule[1], rule[2], rule[3], rule[4], rule[5]
    local key = KEYS[ki]
    local flag, r1, r2, r3 = 0, 0, 0, 0
    --@dispatch check
    if flag ~= 1 then reply[o] = 0 end
    local c = o + 1 + i * 4
    reply[c], reply[c + 1], reply[c + 2], reply[c + 3] = flag, r1, r2, r3
  end
  if reply[o] == 0 then return end
  for i = 0, n - 1 do
    local cost = zcost[i]
    if cost > 0 then
      local rule, ki = zrule[i], zbucket[i]
      local alg, p1, p2, p3, p4 = rule[1], rule[2], rule[3], rule[4], rule[5]
      local key = KEYS[ki]
      local c = o + 1 + i * 4
      local r1, r2, r3 = reply[c + 1], reply[c + 2], reply[c + 3]
      --@dispatch commit
    end
  end
end

local a, o = 3 + 5 * nrules, 1
local nargs = #ARGV
while a <= nargs do
  local n = tonumber(ARGV[a])
  local ok, err = pcall(one, n, a + 1, o)
  if not ok then
    if type(err) ~= 'table' then err = {err = tostring(err)} end
    reply[o] = err
    for j = o + 1, o + 4 * n do reply[j] = 0 end
  end
  a, o = a + 1 + 3 * n, o + 1 + 4 * n
end
flush()
return reply
