package limiter

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// outageLimiter returns a limiter on a Redis store with a short timeout and
// a breaker that opens at the first failure, a deny cache and local
// fallback buckets, and a zone of 10 per second, burst 10, on two nodes.
func outageLimiter(t *testing.T, srv *redistest.Server) (*Limiter, *Rule) {
	t.Helper()
	r, err := NewRule(RuleConfig{Name: "o", Rate: 10, Per: time.Second, Burst: 10, FleetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 100 * time.Millisecond,
		MaxWait: 200 * time.Millisecond, BreakerFailures: 1, BreakerCooldown: 50 * time.Millisecond})
	local := NewMemoryStore(MemoryOptions{})
	t.Cleanup(func() { _ = local.Close() })
	l := New(rs, Options{Cache: NewDenyCache(DenyCacheOptions{}), Local: local})
	t.Cleanup(l.Close)
	return l, r
}

// pauseRedis pauses srv and returns the function that resumes it; a test
// that fails before calling it leaves Redis resumed all the same.
func pauseRedis(t *testing.T, srv *redistest.Server) (resume func()) {
	srv.Pause()
	var once sync.Once
	resume = func() { once.Do(srv.Resume) }
	t.Cleanup(resume)
	return resume
}

// drain takes every token of the key's bucket through l, and returns when
// the last one went.
func drain(t *testing.T, l *Limiter, r *Rule, key string) time.Time {
	t.Helper()
	for range 100 {
		reqs := []Request{{Rule: r, Key: key, Cost: 1}}
		if out := l.Decide(context.Background(), reqs, make([]Result, 1)); out != Allowed {
			if out != Denied {
				t.Fatalf("draining: %s", out)
			}
			return time.Now()
		}
	}
	t.Fatal("the bucket did not run dry in 100 requests")
	return time.Time{}
}

// localAdmits decides requests for the key until the local fallback
// denies one, and returns how many it admitted. Denials by the deny cache
// (what Redis said last, before it stopped) come first.
func localAdmits(t *testing.T, l *Limiter, r *Rule, key string) int64 {
	t.Helper()
	var n int64
	for range 1000 {
		out := l.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, make([]Result, 1))
		switch out {
		case LocalAllowed:
			n++
		case LocalDenied:
			return n
		case Denied:
			time.Sleep(5 * time.Millisecond)
		default:
			t.Fatalf("Redis is paused and the decision was %s", out)
		}
	}
	t.Fatal("the local bucket admitted 100 requests")
	return n
}

// TestOutageLocalStartsFromRedis drains a key's bucket in Redis, then pauses
// Redis: the key's local bucket starts from what Redis last said (empty,
// refilled since at this node's share of the rate), not full.
func TestOutageLocalStartsFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	l, r := outageLimiter(t, srv)
	drained := drain(t, l, r, "k")
	srv.Pause()
	defer srv.Resume()
	n := localAdmits(t, l, r, "k")
	// The node's share: 5 per second, from empty.
	elapsed := time.Since(drained)
	bound := 1 + int64(elapsed.Seconds()*5)
	t.Logf("local admits right after the drain: %d in %s (bound %d; a full local bucket holds 5)", n, elapsed.Round(time.Millisecond), bound)
	if n > bound {
		t.Fatalf("the local bucket admitted %d right after Redis said the bucket was empty (at most %d)", n, bound)
	}
	// A key this node never saw starts at burst / fleet size (and
	// refills at 5 per second meanwhile).
	start := time.Now()
	n = localAdmits(t, l, r, "fresh")
	if most := 5 + int64(time.Since(start).Seconds()*5); n < 5 || n > most {
		t.Fatalf("a key never seen: %d local admits, want 5 (burst 10 / 2 nodes), at most %d with the refill", n, most)
	}
}

// TestOutageChargedOnReturn: what the local bucket admitted while Redis was
// paused is charged to Redis before the key is decided there again, so
// that over the drain, the outage and the return the key gets no more than
// the refill of the time elapsed.
func TestOutageChargedOnReturn(t *testing.T) {
	srv := redistest.Start(t)
	l, r := outageLimiter(t, srv)
	drained := drain(t, l, r, "k")
	resume := pauseRedis(t, srv)
	time.Sleep(600 * time.Millisecond)
	local := localAdmits(t, l, r, "k")
	resume()
	var back int64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
		if out == Allowed {
			back++
			continue
		}
		if out == Denied {
			break
		}
		time.Sleep(10 * time.Millisecond) // the breaker's cooldown, a probe
	}
	elapsed := time.Since(drained)
	bound := 1 + int64(elapsed.Seconds()*10)
	t.Logf("after the drain: %d admitted locally, %d by Redis on its return, in %s (bound %d)",
		local, back, elapsed.Round(time.Millisecond), bound)
	if local == 0 {
		t.Fatal("the local bucket admitted nothing in 600ms at 5 per second")
	}
	if local+back > bound {
		t.Fatalf("%d + %d admitted in %s: more than the refill (%d): the local admits were not charged", local, back, elapsed.Round(time.Millisecond), bound)
	}
}

// TestChargeLeavesDebt: a charge may leave a bucket owing more than its
// capacity, and the key then waits for the refill it owes.
func TestChargeLeavesDebt(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	r := mustRule(t, "c", 10, time.Second, 10)
	// Three bucketfuls: 30 tokens.
	if err := rs.Charge(context.Background(), []Charge{{Rule: r, Key: "k", Ticks: 3 * r.capacity}}); err != nil {
		t.Fatal(err)
	}
	// The bucket is full again 3 seconds after the charge: its stored
	// time (microseconds and 3 digits of ticks) against Redis' clock.
	v, err := strconv.ParseInt(srv.MustDo("GET", rs.Key(r.bucket, "k")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	tm := strings.Fields(srv.MustDo("TIME"))
	sec, _ := strconv.ParseInt(strings.Trim(tm[0], "[]\"\n"), 10, 64)
	usec, _ := strconv.ParseInt(strings.Trim(tm[1], "[]\"\n"), 10, 64)
	owed := time.Duration(v/1000-(sec*1e6+usec)) * time.Microsecond
	t.Logf("after a charge of 30 tokens the bucket is full in %s", owed)
	if owed < 2500*time.Millisecond || owed > 3*time.Second {
		t.Fatalf("after a charge of 30 tokens at 10 per second the bucket is full in %s, want about 3s", owed)
	}
	res := make([]Result, 1)
	if ok, err := rs.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res); err != nil || ok {
		t.Fatalf("a bucket in debt: allowed %v, %v", ok, err)
	}
}

// TestDivisorKeepsLargestFleet: the fleet view saw 3 nodes, then Redis came
// back empty and the view sees this node alone: the local buckets still
// divide by 3, and a node that never saw the fleet divides by 1 and says
// so.
func TestDivisorKeepsLargestFleet(t *testing.T) {
	t.Parallel()
	// Nothing listens there: every decision fails, at once.
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	rs := newRedisStore(t, RedisOptions{Address: addr})
	local := NewMemoryStore(MemoryOptions{})
	t.Cleanup(func() { _ = local.Close() })
	r, err := NewRule(RuleConfig{Name: "d", Rate: 30, Per: time.Hour, Burst: 30})
	if err != nil {
		t.Fatal(err)
	}
	var view atomic.Int64
	view.Store(3)
	core, logs := observer.New(zap.InfoLevel)
	l := New(rs, Options{Local: local, FleetSize: view.Load, Log: zap.New(core)})
	t.Cleanup(l.Close)
	if out := l.Decide(context.Background(), []Request{{Rule: r, Key: "a", Cost: 1}}, make([]Result, 1)); out != LocalAllowed {
		t.Fatalf("first decision: %s", out)
	}
	view.Store(1) // Redis restarted empty: the view sees this node alone
	n := 0
	for range 40 {
		if l.Decide(context.Background(), []Request{{Rule: r, Key: "b", Cost: 1}}, make([]Result, 1)) == LocalAllowed {
			n++
		}
	}
	t.Logf("local admits after the fleet view dropped from 3 nodes to 1: %d", n)
	if n != 10 {
		t.Fatalf("%d local admits of a burst of 30 after the view dropped from 3 to 1 node: want 10 (the divisor stays 3)", n)
	}
	changes := logs.FilterMessage("rate limit local fallback divisor changed").All()
	if len(changes) != 1 || changes[0].ContextMap()["new"] != int64(3) || changes[0].ContextMap()["old"] != int64(1) {
		t.Fatalf("divisor changes logged: %v, want one from 1 to 3", changes)
	}

	// A node that never saw the fleet divides by 1, and warns.
	core, logs = observer.New(zap.InfoLevel)
	l2 := New(rs, Options{Local: local, FleetSize: func() int64 { return 1 }, Log: zap.New(core)})
	t.Cleanup(l2.Close)
	l2.Decide(context.Background(), []Request{{Rule: r, Key: "c", Cost: 1}}, make([]Result, 1))
	if logs.FilterMessageSnippet("divides by 1").Len() == 0 {
		t.Fatalf("a node with no fleet view did not warn that it divides by 1: %v", logs.All())
	}
}

// TestBreakerClosesEverywhere: two nodes' breakers are open; the first
// whose call finds Redis answering closes the other's too, through the
// ban channel, long before the other's cooldown ends.
func TestBreakerClosesEverywhere(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := newRedisStore(t, RedisOptions{Address: srv.Addr, BreakerFailures: 1, BreakerCooldown: 10 * time.Millisecond})
	b := newRedisStore(t, RedisOptions{Address: srv.Addr, BreakerFailures: 1, BreakerCooldown: time.Hour})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasSuffix(srv.MustDo("PUBSUB", "NUMSUB", a.banChannel()), "\n2") {
		if time.Now().After(deadline) {
			t.Fatalf("the stores did not subscribe to %s: %s", a.banChannel(), srv.MustDo("PUBSUB", "NUMSUB", a.banChannel()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.Breaker().Failure()
	b.Breaker().Failure()
	if a.Breaker().State() == BreakerClosed || b.Breaker().State() != BreakerOpen {
		t.Fatalf("breakers %s and %s, want both open", a.Breaker().State(), b.Breaker().State())
	}
	r := mustRule(t, "be", 10, time.Second, 10)
	for a.Breaker().State() != BreakerClosed && time.Now().Before(deadline) {
		_, _ = a.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
		time.Sleep(20 * time.Millisecond)
	}
	for b.Breaker().State() != BreakerClosed && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if b.Breaker().State() != BreakerClosed {
		t.Fatalf("the other store's breaker is %s after the first closed (its cooldown is an hour)", b.Breaker().State())
	}
}

// TestLateNodeHoldsTheGrace: two nodes decide a drained key locally while
// Redis is paused. When it resumes, one node comes back at once and the
// other a second later: the first keeps deciding the key locally until the
// late node's charges are in, so that over the drain, the outage and the
// return the two get no more than the refill of the time elapsed.
func TestLateNodeHoldsTheGrace(t *testing.T) {
	srv := redistest.Start(t)
	a, r := outageLimiter(t, srv)
	b, _ := outageLimiter(t, srv)
	drained := drain(t, a, r, "k")
	resume := pauseRedis(t, srv)
	time.Sleep(600 * time.Millisecond)
	local := localAdmits(t, a, r, "k") + localAdmits(t, b, r, "k")
	resume()
	back := time.Now()

	// The first node, alone for a second: local decisions only.
	decide := func(l *Limiter) Outcome {
		return l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
	}
	var admitted int64
	for time.Since(back) < time.Second {
		switch out := decide(a); out {
		case LocalAllowed:
			admitted++
		case LocalDenied:
		default:
			t.Fatalf("%s after Redis came back, the first node's decision was %s while the other node's charges were not in", time.Since(back).Round(time.Millisecond), out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The late node comes back; then both decide on Redis again.
	lateBack := time.Now()
	var onRedis time.Duration
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		outB, outA := decide(b), decide(a)
		for _, out := range []Outcome{outA, outB} {
			if out == Allowed || out == LocalAllowed {
				admitted++
			}
		}
		if outA == Allowed || outA == Denied {
			if onRedis == 0 {
				onRedis = time.Since(lateBack)
			}
			if outB == Allowed || outB == Denied {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if onRedis == 0 {
		t.Fatal("the first node did not decide on Redis again within 5s of the late node's return")
	}
	elapsed := time.Since(drained)
	bound := 1 + int64(elapsed.Seconds()*10)
	t.Logf("%d admitted locally in the outage, %d after; the first node on Redis %s after the late node came back; %s since the drain (bound %d)",
		local, admitted, onRedis.Round(time.Millisecond), elapsed.Round(time.Millisecond), bound)
	if local+admitted > bound {
		t.Fatalf("%d + %d admitted in %s: more than the refill (%d)", local, admitted, elapsed.Round(time.Millisecond), bound)
	}
}

// TestIdleNodeDoesNotHoldTheGrace: of two nodes, one decides a key locally
// while Redis is paused, the other decides nothing at all (it saw no
// failure). When Redis resumes, the idle node hears that the first is
// charging and adds itself to the set of nodes whose charges are in, so
// that the first goes back to Redis without waiting returnGraceMax.
func TestIdleNodeDoesNotHoldTheGrace(t *testing.T) {
	srv := redistest.Start(t)
	a, r := outageLimiter(t, srv)
	_, _ = outageLimiter(t, srv) // the idle node: its store subscribes to the ban channel
	drain(t, a, r, "k")
	resume := pauseRedis(t, srv)
	time.Sleep(300 * time.Millisecond)
	localAdmits(t, a, r, "k")
	resume()
	back := time.Now()
	var onRedis time.Duration
	for time.Since(back) < 5*time.Second {
		out := a.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
		if out == Allowed || out == Denied {
			onRedis = time.Since(back)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if onRedis == 0 {
		t.Fatal("the node did not decide on Redis again within 5s")
	}
	rs := a.store.(*RedisStore)
	n, err := rs.client.ZCard(context.Background(), rs.chargedKey()).Result()
	t.Logf("back on Redis %s after it resumed; %d nodes in the set of charges in", onRedis.Round(time.Millisecond), n)
	if err != nil || n != 2 {
		t.Fatalf("the set of nodes whose charges are in holds %d (%v), want 2: the idle node did not add itself", n, err)
	}
}
