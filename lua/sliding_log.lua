-- sliding_log.lua: exactly at most limit tokens in any window. The key is
-- a sorted set of the admitted requests, scored by their time (us), each
-- member "time:cost:n"; entries that left the window are trimmed on every
-- decision, so memory is bounded by the limit. See limiter/slidinglog.go.
--
-- Parameters: p1 window (us), p2 limit; aux the reserve (requests).
-- Reports: flag, tokens in the window, microseconds until a retry fits
-- (when denied), microseconds until the log is empty.

--@helpers
local function log_cost(member)
  return tonumber(match(member, '^[^:]+:(%d+):')) or 1
end

--@check
call('ZREMRANGEBYSCORE', key, '-inf', now - p1)
local items = call('ZRANGE', key, 0, -1, 'WITHSCORES')
r1, r2, r3 = 0, 0, 0
for j = 1, #items, 2 do r1 = r1 + log_cost(items[j]) end
if #items > 0 then r3 = tonumber(items[#items]) + p1 - now end
local res = auxn
if cost + res > p2 then
  flag = NEVER
elseif r1 + cost + res <= p2 then
  flag = ADMIT
else
  flag = DENY
  local need, freed = r1 + cost + res - p2, 0
  for j = 1, #items, 2 do
    freed = freed + log_cost(items[j])
    if freed >= need then
      r2 = tonumber(items[j + 1]) + p1 - now
      break
    end
  end
end

--@peek
-- The check's reading without its trim: the entries still in the window.
local items = call('ZRANGEBYSCORE', key, '(' .. digits(now - p1), '+inf', 'WITHSCORES')
r1, r2, r3 = 0, 0, 0
for j = 1, #items, 2 do r1 = r1 + log_cost(items[j]) end
if #items > 0 then r3 = tonumber(items[#items]) + p1 - now end
flag = ADMIT

--@commit
local m = call('ZCARD', key)
local member = format('%d:%d:%d', now, cost, m)
while call('ZSCORE', key, member) do
  m = m + 1
  member = format('%d:%d:%d', now, cost, m)
end
call('ZADD', key, now, member)
call('PEXPIRE', key, ceil_div(p1, 1000))

--@refund
-- Remove the entry the charge added: of this cost, at its time (aux).
local items = call('ZRANGEBYSCORE', key, aux, aux)
for j = #items, 1, -1 do
  if log_cost(items[j]) == cost then
    call('ZREM', key, items[j])
    break
  end
end
