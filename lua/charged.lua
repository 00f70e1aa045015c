-- charged.lua: the outage barrier. A node whose charges are in after an
-- outage adds itself to the set of such nodes, scored by this server's
-- TIME (never by the node's clock, which may be off), the entries older
-- than the window are dropped, and the set's size is the reply.
--
-- KEYS: the set. ARGV: the node's id, then the window in milliseconds.
local node, window = unpack(ARGV)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], string.format('%d', now), node)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now - window))
redis.call('PEXPIRE', KEYS[1], 2 * window)
return redis.call('ZCARD', KEYS[1])
