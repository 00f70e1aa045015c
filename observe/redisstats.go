package observe

import (
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/redis/go-redis/v9"
)

// redisStats reads and writes what a fleet's nodes share in Redis for
// people, not for limits: the fleet counters, the denial
// feed and the clock offset. It goes
// through a Redis store's client, under its key prefix, with its clock;
// no bucket ever reads what it writes.
type redisStats struct {
	client redis.UniversalClient
	prefix string
	clock  limiter.Clock
}

// newRedisStats returns the statistics' view of a Redis store.
func newRedisStats(s *limiter.RedisStore) *redisStats {
	return &redisStats{client: s.Client(), prefix: s.KeyPrefix(), clock: s.Clock()}
}
