package limiter

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func TestLimiterOutcomes(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	l := New(newMemory(t, clk), Options{})
	r := mustRule(t, "api", 1, time.Hour, 2)
	reqs := []Request{{Rule: r, Key: "k", Cost: 1}}
	results := make([]Result, 1)
	for i, want := range []Outcome{Allowed, Allowed, Denied, Denied} {
		if got := l.Decide(context.Background(), reqs, results); got != want {
			t.Fatalf("decision %d: %v, want %v", i, got, want)
		}
	}
	if n := l.Failures(); n != 0 {
		t.Fatalf("Failures() = %d, want 0", n)
	}
}

// TestLimiterFailsOpen points a RedisStore at a port nothing listens on:
// every decision fails open, admitting the request in every zone, and the
// failure is counted and logged at most once a second.
func TestLimiterFailsOpen(t *testing.T) {
	t.Parallel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	rs := newRedisStore(t, RedisOptions{Address: addr, Timeout: 100 * time.Millisecond})
	core, logs := observer.New(zapcore.WarnLevel)
	l := New(rs, Options{Log: zap.New(core)})
	api := mustRule(t, "api", 3, time.Second, 0)
	login := mustRule(t, "login", 5, time.Minute, 10)
	reqs := []Request{{Rule: api, Key: "k", Cost: 1}, {Rule: login, Key: "k", Cost: 1}}
	results := make([]Result, 2)
	start := time.Now()
	for i := range 3 {
		results[0], results[1] = Result{}, Result{RetryAfter: Never}
		if got := l.Decide(context.Background(), reqs, results); got != FailedOpen {
			t.Fatalf("decision %d against a closed port: %v, want FailedOpen", i, got)
		}
		want := []Result{{Allowed: true, Unknown: true}, {Allowed: true, Unknown: true}}
		if results[0] != want[0] || results[1] != want[1] {
			t.Fatalf("decision %d: results %+v, want %+v", i, results, want)
		}
	}
	if n := l.Failures(); n != 3 {
		t.Fatalf("Failures() = %d, want 3", n)
	}
	if n := logs.Len(); n < 1 || (n > 1 && time.Since(start) < time.Second) {
		t.Fatalf("%d failure lines logged within a second, want 1", n)
	}
	entry := logs.All()[0]
	if entry.Level != zapcore.WarnLevel || entry.ContextMap()["failures_total"] != uint64(1) {
		t.Fatalf("log entry %+v", entry)
	}
}
