package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestDecideStopsAtDeadline pauses Redis and decides with a context whose
// deadline comes long before the store's timeout (an Envoy rate limit call
// gives 20ms): the decision ends at the deadline with the zone's failure
// policy, not at the timeout, both for one bucket (one script call) and
// for buckets on several Cluster slots, and also for a request that waits
// for another one's answer about the same bucket (the deny cache).
func TestDecideStopsAtDeadline(t *testing.T) {
	// Not parallel: it times decisions.
	const timeout = 3 * time.Second
	const budget = 50 * time.Millisecond
	margin := 400 * time.Millisecond // a loaded machine fires timers late
	if raceEnabled {
		margin = 900 * time.Millisecond
	}
	check := func(t *testing.T, pause func() func(), rs *RedisStore, keys ...string) {
		r, err := NewRule(RuleConfig{Name: "deadline", Rate: 1000, Per: time.Second, OnError: PolicyDeny})
		if err != nil {
			t.Fatal(err)
		}
		l := New(rs, Options{Cache: NewDenyCache(DenyCacheOptions{})})
		t.Cleanup(l.Close)
		reqs := make([]Request, len(keys))
		for i, k := range keys {
			reqs[i] = Request{Rule: r, Key: k, Cost: 1}
		}
		if out := l.Decide(context.Background(), reqs, make([]Result, len(reqs))); out != Allowed {
			t.Fatalf("before the pause: %s", out)
		}
		resume := pause()
		defer resume()
		// Two at once on the same buckets: the second waits for the
		// first's answer (the deny cache's probe), within its deadline.
		outs := make(chan Outcome, 2)
		took := make(chan time.Duration, 2)
		for range 2 {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				defer cancel()
				start := time.Now()
				own := append([]Request(nil), reqs...)
				outs <- l.Decide(ctx, own, make([]Result, len(own)))
				took <- time.Since(start)
			}()
		}
		for range 2 {
			if out, d := <-outs, <-took; out != FailedClosed || d > budget+margin {
				t.Errorf("with Redis paused and a %s deadline: %s after %s, want %s within %s", budget, out, d, FailedClosed, budget+margin)
			}
		}
	}
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Start(t)
		rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, DisableStallClock: true})
		check(t, func() func() { return pauseRedis(t, srv) }, rs, "a")
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		rs := newRedisStore(t, RedisOptions{Addresses: cl.Addrs(), Timeout: timeout, DisableStallClock: true})
		pauseAll := func() func() {
			var resumes []func()
			for _, n := range cl.Nodes() {
				resumes = append(resumes, pauseRedis(t, n))
			}
			return func() {
				for _, r := range resumes {
					r()
				}
			}
		}
		// Keys on several slots: one script call per slot.
		check(t, pauseAll, rs, "a", "b", "c", "d", "e", "f")
	})
}

// TestStoreDeadlineIsTimeout: a store decision whose context's deadline
// ends the wait fails with ErrStoreTimeout, the error a zone's failure
// policy answers, while an ended context that was canceled stays
// context.Canceled.
func TestStoreDeadlineIsTimeout(t *testing.T) {
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 3 * time.Second, DisableStallClock: true})
	r := mustRule(t, "api", 1000, time.Second, 0)
	decideOne(t, rs, r, "k", 1)
	resume := pauseRedis(t, srv)
	defer resume()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := rs.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
	if took := time.Since(start); !errors.Is(err, ErrStoreTimeout) || took > time.Second {
		t.Fatalf("decision with a 30ms deadline: %v after %s, want ErrStoreTimeout well before the 3s timeout", err, took)
	}
}

// TestDeadlineBreaker: decisions cut short by callers' deadlines open the
// circuit breaker once Redis has left a round trip unanswered for the
// timeout (counted once per timeout, as for decisions without deadlines),
// and not while it is merely slower than short deadlines.
func TestDeadlineBreaker(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 200 * time.Millisecond
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, DisableStallClock: true, BreakerFailures: 3})
	r := mustRule(t, "api", 1000, time.Second, 0)
	decideOne(t, rs, r, "k", 1)
	resume := pauseRedis(t, srv)
	defer resume()
	decideBy := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := rs.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
		return err
	}
	// 9 x 20ms: the round trip is out for less than the timeout.
	for range 9 {
		if err := decideBy(timeout / 10); !errors.Is(err, ErrStoreTimeout) {
			t.Fatalf("short deadline: %v, want ErrStoreTimeout", err)
		}
	}
	if n := rs.Breaker().Opened(); n != 0 {
		t.Fatalf("decisions cut by short deadlines within the timeout opened the breaker (%d times)", n)
	}
	// Then the round trip is out for 1, 2, 3... timeouts: 3 failures.
	for i := 0; i < 20 && rs.Breaker().Opened() == 0; i++ {
		_ = decideBy(timeout / 2)
	}
	if rs.Breaker().Opened() == 0 {
		t.Fatal("Redis left a round trip unanswered for 10 timeouts and the breaker did not open (3 failures open it)")
	}
}
