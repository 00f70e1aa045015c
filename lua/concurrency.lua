-- concurrency.lua: at most limit requests of a key in flight at once,
-- across the fleet. The key is a sorted set of the slots held, each member
-- a slot's id (made by the node: unique in the fleet), scored by the
-- moment its lease ends; expired slots (their node died before releasing
-- them) are pruned on every decision, and the key expires with its last
-- lease. A request takes cost slots when admitted (members aux, then
-- aux#2 .. aux#cost) and its node releases them (refund) when the request
-- ends. See limiter/concurrency.go.
--
-- Parameters: p1 limit, p2 lease (us); aux the slot's id.
-- Reports: flag, slots held before the request, 0, 0.

--@check
call('ZREMRANGEBYSCORE', key, '-inf', now)
r1 = call('ZCARD', key)
if cost > p1 then flag = NEVER elseif r1 + cost <= p1 then flag = ADMIT else flag = DENY end

--@peek
-- The slots whose lease has not ended, without pruning the others.
r1 = #call('ZRANGEBYSCORE', key, '(' .. digits(now), '+inf')
flag = ADMIT

--@commit
call('ZADD', key, now + p2, aux)
for j = 2, cost do call('ZADD', key, now + p2, aux .. '#' .. j) end
call('PEXPIRE', key, ceil_div(p2, 1000))

--@refund
call('ZREM', key, aux)
for j = 2, cost do call('ZREM', key, aux .. '#' .. j) end
