package observe

import (
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// startRedisStats returns the shared statistics of a Redis store, closed
// when the test ends. A generous timeout, so that a loaded machine cannot
// fail the tests.
func startRedisStats(t testing.TB, opt limiter.RedisOptions) *redisStats {
	t.Helper()
	if opt.Timeout == 0 {
		opt.Timeout = 5 * time.Second
	}
	s, err := limiter.NewRedisStore(opt)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return newRedisStats(s)
}
