-- sliding_log.lua: exactly at most limit tokens in any window. The key is
-- a sorted set of the admitted requests, scored by their time (us), each
-- member "time:cost:n"; entries that left the window are trimmed on every
-- decision, so memory is bounded by the limit. See limiter/slidinglog.go.
--
-- Parameters: p1 window (us), p2 limit.
-- Reply: flag, tokens in the window, microseconds until a retry fits (when
-- denied), microseconds until the log is empty.

local function log_entries(key, window, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  return redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
end

local function log_cost(member)
  local c = string.match(member, '^[^:]+:(%d+):')
  return tonumber(c) or 1
end

ALG[3] = {
  check = function(key, p, cost, now)
    local window, limit = p[1], p[2]
    local items = log_entries(key, window, now)
    local used, reset = 0, 0
    for i = 1, #items, 2 do
      used = used + log_cost(items[i])
    end
    if #items > 0 then reset = tonumber(items[#items]) + window - now end
    if cost > limit then return {2, used, 0, reset} end
    if used + cost <= limit then return {1, used, 0, reset} end
    local need, freed, retry = used + cost - limit, 0, 0
    for i = 1, #items, 2 do
      freed = freed + log_cost(items[i])
      if freed >= need then
        retry = tonumber(items[i + 1]) + window - now
        break
      end
    end
    return {0, used, retry, reset}
  end,
  commit = function(key, p, cost, now, v)
    local window = p[1]
    local n = redis.call('ZCARD', key)
    local member = string.format('%d:%d:%d', now, cost, n)
    while redis.call('ZSCORE', key, member) do
      n = n + 1
      member = string.format('%d:%d:%d', now, cost, n)
    end
    redis.call('ZADD', key, now, member)
    redis.call('PEXPIRE', key, ceil_div(window, 1000))
  end,
  refund = function(key, p, cost, now)
    -- Remove the newest entry of this cost: the one the charge added.
    local items = redis.call('ZREVRANGE', key, 0, -1)
    for i = 1, #items do
      if log_cost(items[i]) == cost then
        redis.call('ZREM', key, items[i])
        return
      end
    end
  end,
}
