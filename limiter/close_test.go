package limiter

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestNoGoroutineOutlivesClose: a limiter on a Redis store with every
// background task started (pipeline workers, the ban channel's subscriber,
// prefetch's sweeper, a spare refunded, a memory store's sweeper for the
// fallback) leaves no goroutine behind once the limiter and its stores are
// closed.
func TestNoGoroutineOutlivesClose(t *testing.T) {
	srv := redistest.Start(t)
	before := runtime.NumGoroutine()
	rs, err := NewRedisStore(RedisOptions{Address: srv.Addr, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ms := NewMemoryStore(MemoryOptions{})
	l := New(rs, Options{Local: ms, Cache: NewDenyCache(DenyCacheOptions{})})
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 100, Per: time.Second, Burst: 100, Prefetch: 10})
	ban := mustConfig(t, RuleConfig{Name: "ban", Rate: 1, Per: time.Hour, Burst: 1, Ban: Ban{Duration: time.Hour, After: 1, Window: time.Hour}})
	for range 30 {
		l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, make([]Result, 1))
		l.Decide(context.Background(), []Request{{Rule: ban, Key: "b", Cost: 1}}, make([]Result, 1))
	}
	if _, _, err := l.Unban(context.Background(), ban, "b"); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l.Decide(context.Background(), []Request{{Rule: pf, Key: "late", Cost: 1}}, make([]Result, 1)) // after Close
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ms.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines 10 s after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
