package limiter

import (
	"errors"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestIdleProbeFindsStalledRedis: with no decision going to Redis, the
// store still learns that Redis stopped answering (a PING at most once a
// second, off the request path), and that it answers again; its breaker
// opens after enough failed probes, as after failed decisions.
func TestIdleProbeFindsStalledRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 25 * time.Millisecond, BreakerFailures: 2})

	waitProbe := func(what string, ok func(RedisProbe) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			if p, seen := s.LastProbe(); seen && p.At.After(start) && ok(p) {
				return time.Since(start)
			}
			if time.Since(start) > 15*time.Second {
				p, seen := s.LastProbe()
				t.Fatalf("no probe %s 15 s on (last %+v, seen %v)", what, p, seen)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	took := waitProbe("answered", func(p RedisProbe) bool { return p.Err == nil })
	t.Logf("a probe answered %s in", took)

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	took = waitProbe("failed", func(p RedisProbe) bool { return p.Err != nil })
	t.Logf("the stall was found by a probe %s after SIGSTOP, with no traffic", took)
	p, _ := s.LastProbe()
	if !errors.Is(p.Err, ErrStoreTimeout) {
		t.Errorf("probe of a stalled Redis failed with %v, want a store timeout", p.Err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for s.Breaker().State() == BreakerClosed {
		if time.Now().After(deadline) {
			t.Fatal("breaker still closed 15 s after the probes began to fail")
		}
		time.Sleep(20 * time.Millisecond)
	}

	srv.Resume()
	resumed = true
	took = waitProbe("answered after Resume", func(p RedisProbe) bool { return p.Err == nil })
	t.Logf("a probe answered %s after SIGCONT", took)
	deadline = time.Now().Add(15 * time.Second)
	for s.Breaker().State() != BreakerClosed {
		if time.Now().After(deadline) {
			t.Fatal("breaker not closed 15 s after Redis answered a probe, with no traffic")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
