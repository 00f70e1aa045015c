package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestSettleTokens: the difference a settlement charges is real - upfront,
// capped at the burst, without overflowing for a hostile real cost.
func TestSettleTokens(t *testing.T) {
	r := mustConfig(t, RuleConfig{Name: "s", Rate: 10, Per: time.Second, Burst: 100})
	for _, c := range []struct {
		upfront, real, want int64
		capped              bool
	}{
		{1, 1, 0, false},
		{1, 500, 100, true},
		{1, 101, 100, false},
		{1, 102, 100, true},
		{5, 0, -5, false},
		{5, -3, -5, false},
		{1, math.MaxInt64, 100, true},
		{0, math.MaxInt64, 100, true},
	} {
		if got, capped := SettleTokens(r, c.upfront, c.real); got != c.want || capped != c.capped {
			t.Errorf("SettleTokens(%d, %d) = %d, %v; want %d, %v", c.upfront, c.real, got, capped, c.want, c.capped)
		}
	}
}

// settleStores are the stores a settlement conformance trace compares:
// Redis (single or Cluster) and memory, on one controlled clock.
type settleStores struct {
	rs  *RedisStore
	ms  *MemoryStore
	clk *testClock
}

// settle applies tokens (SettleTokens' difference) to both stores, as
// Limiter.Settle does: a charge, or a refund.
func (s settleStores) settle(t *testing.T, q Request, res Result, tokens int64) {
	t.Helper()
	ctx := context.Background()
	if tokens > 0 {
		ch := []Charge{{Rule: q.Rule, Key: q.Key, Ticks: q.Rule.chargeUnits(tokens)}}
		if err := s.rs.Charge(ctx, ch); err != nil {
			t.Fatalf("redis charge: %v", err)
		}
		_ = s.ms.Charge(ctx, ch)
		return
	}
	q.Cost = -tokens
	if err := s.rs.Refund(ctx, []Request{q}, []Result{res}); err != nil {
		t.Fatalf("redis refund: %v", err)
	}
	_ = s.ms.Refund(ctx, []Request{q}, []Result{res})
}

// TestSettleRedisMatchesMemory replays random traces of decisions and
// settlements (charges beyond the capacity, refunds of part of the
// up-front cost, hostile costs capped at the burst) through the refund
// script's charge mode on a single Redis and a Cluster and through the
// memory store, on token buckets and a quota: every Result must be the
// same, and so Retry-After and the reset count a debt beyond the capacity
// alike.
func TestSettleRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		clk := newTestClock(epoch)
		rs := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "set:", Clock: clk})
		settleTrace(t, settleStores{rs, newMemory(t, clk), clk}, 1)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.StartCluster(t, 3)
		clk := newTestClock(epoch + 1e12)
		rs := newRedisStore(t, RedisOptions{Addresses: cl.Addrs(), Cluster: true, KeyPrefix: "set:", Clock: clk})
		settleTrace(t, settleStores{rs, newMemory(t, clk), clk}, 2)
	})
}

// settleTrace runs one trace of 600 decisions over three keys.
func settleTrace(t *testing.T, s settleStores, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5e771e))
	rules := []*Rule{
		mustConfig(t, RuleConfig{Name: "llm", Rate: 100, Per: time.Second, Burst: 50, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "slow", Rate: 3, Per: time.Second, Burst: 5, Refunds: true}),
		mustConfig(t, RuleConfig{Name: "plan", Algorithm: Quota, Rate: 200, Period: Day}),
	}
	keys := []string{"a", "b", "2,c"}
	counts := map[string]int{}
	prevWall := time.Now()
	for n := range 600 {
		wall := time.Now() // simulated time outruns Redis' TTLs (see replayTrace)
		s.clk.add(2*int64(wall.Sub(prevWall)/time.Microsecond) + 5000)
		prevWall = wall
		if rng.IntN(3) == 0 {
			s.clk.add(rng.Int64N(2_000_000))
		}
		r := rules[rng.IntN(len(rules))]
		q := Request{Rule: r, Key: keys[rng.IntN(len(keys))], Cost: 1 + rng.Int64N(3)}
		got, want := make([]Result, 1), make([]Result, 1)
		okR, err := s.rs.Decide(context.Background(), []Request{q}, got)
		if err != nil {
			t.Fatalf("decision %d: %v", n, err)
		}
		okM, _ := s.ms.Decide(context.Background(), []Request{q}, want)
		if okR != okM || !equalResults(got, want) {
			t.Fatalf("decision %d at +%dus, %s:\nredis  %v %+v\nmemory %v %+v", n, s.clk.now()-epoch, describe([]Request{q}), okR, got, okM, want)
		}
		full := time.Duration(r.burst) * r.per / time.Duration(r.rate)
		switch {
		case !okR && r.alg == Quota:
			counts["quota denied"]++
		case !okR && got[0].ResetAfter > full:
			counts["denied in debt beyond the capacity"]++
		case !okR:
			counts["denied"]++
		default:
			counts["admitted"]++
		}
		if !okR || rng.IntN(3) == 0 {
			continue
		}
		var real int64
		switch x := rng.IntN(10); {
		case x < 2:
			real = rng.Int64N(q.Cost) // less: a refund
		case x < 8:
			real = q.Cost + 1 + rng.Int64N(2*r.burst)
		case x < 9:
			real = math.MaxInt64
		default:
			real = q.Cost
		}
		tokens, capped := SettleTokens(r, q.Cost, real)
		if capped {
			counts["capped"]++
		}
		if tokens < 0 {
			counts["refunds"]++
		} else if tokens > 0 {
			counts["charges"]++
		}
		if tokens != 0 {
			s.settle(t, q, got[0], tokens)
		}
	}
	t.Logf("settlement trace (seed %d): %v", seed, counts)
	for _, c := range []string{"denied in debt beyond the capacity", "quota denied", "capped", "refunds", "charges", "admitted"} {
		if counts[c] == 0 {
			t.Errorf("the trace never covered %q: %v", c, counts)
		}
	}
}

// TestSettleDebt: a key that drained its bucket and then reports ten
// times its up-front cost owes beyond the capacity; its next request is
// denied with a Retry-After that counts the whole debt, and admitted once
// that has passed, on the memory store and on Redis (single and Sentinel)
// alike.
func TestSettleDebt(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"memory", "redis", "sentinel"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clk := newTestClock(epoch + 2e12)
			var store Store = newMemory(t, clk)
			switch name {
			case "redis":
				srv := redistest.Start(t)
				store = newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "debt:", Clock: clk})
			case "sentinel":
				st := redistest.StartSentinel(t)
				store = newRedisStore(t, RedisOptions{SentinelMaster: st.MasterName(), SentinelAddresses: st.SentinelAddrs(),
					KeyPrefix: "debt:", Clock: clk})
			}
			l := New(store, Options{})
			t.Cleanup(l.Close)
			r := mustConfig(t, RuleConfig{Name: "tok", Rate: 10, Per: time.Second, Burst: 10, Refunds: true})
			ctx := context.Background()
			// Ten requests in flight at once, cost 1 each, that then
			// report 10 each: 90 tokens owed beyond the burst.
			var admitted []Result
			for i := range 10 {
				res := make([]Result, 1)
				if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Allowed {
					t.Fatalf("request %d: %s", i, out)
				}
				admitted = append(admitted, res[0])
			}
			for i, res := range admitted {
				st, err := l.Settle(ctx, Allowed, Request{Rule: r, Key: "k", Cost: 1}, res, 10)
				if err != nil || st.Tokens != 9 || st.Attempts != 1 {
					t.Fatalf("settlement %d: %+v, %v", i, st, err)
				}
			}
			res := make([]Result, 1)
			if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Denied {
				t.Fatalf("in debt: %s", out)
			}
			// 100 tokens owed at 10/s: a token is back after 9.1s.
			if res[0].RetryAfter != 9100*time.Millisecond || res[0].ResetAfter != 10*time.Second {
				t.Fatalf("in debt: RetryAfter %v, ResetAfter %v; want 9.1s and 10s", res[0].RetryAfter, res[0].ResetAfter)
			}
			clk.add(9_099_000)
			if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Denied {
				t.Fatalf("a millisecond before the debt is repaid: %s", out)
			}
			clk.add(1000)
			if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Allowed {
				t.Fatalf("once the debt is repaid: %s %+v", out, res[0])
			}
			// A response that cost less than its up-front cost gives the
			// rest back.
			reqs := []Request{{Rule: r, Key: "k", Cost: 1}}
			clk.add(1_000_000) // 10 back
			if out := l.Decide(ctx, reqs, res); out != Allowed || res[0].Remaining != 9 {
				t.Fatalf("after a second: %s %+v", out, res[0])
			}
			if st, err := l.Settle(ctx, Allowed, reqs[0], res[0], 0); err != nil || st.Tokens != -1 {
				t.Fatalf("refund: %+v, %v", st, err)
			}
			if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 0}}, res); out != Allowed || res[0].Remaining != 10 {
				t.Fatalf("after the refund: %s %+v, want 10 left", out, res[0])
			}
			if settled, lost := l.Settlements(); settled != 11 || lost != 0 {
				t.Errorf("Settlements() = %d, %d; want 11, 0", settled, lost)
			}
		})
	}
}

// TestSettleLost: a charge that the store keeps failing is sent
// settleAttempts times, then lost and counted, never silently.
func TestSettleLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "lost:", Timeout: 50 * time.Millisecond,
		MaxWait: 100 * time.Millisecond, BreakerFailures: 100})
	obs := &settleCounter{}
	l := New(rs, Options{Observer: obs})
	t.Cleanup(l.Close)
	r := mustConfig(t, RuleConfig{Name: "tok", Rate: 10, Per: time.Second, Burst: 10, Refunds: true})
	reqs, res := []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1)
	if out := l.Decide(context.Background(), reqs, res); out != Allowed {
		t.Fatal(out)
	}
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	st, err := l.Settle(context.Background(), Allowed, reqs[0], res[0], 8)
	took := time.Since(start)
	t.Logf("a lost settlement took %v in %d attempts: %v", took, st.Attempts, err)
	if !errors.Is(err, ErrNotSettled) || st.Attempts != settleAttempts {
		t.Fatalf("Settle against a paused Redis: %+v, %v; want ErrNotSettled after %d attempts", st, err, settleAttempts)
	}
	if _, lost := l.Settlements(); lost != 1 || obs.lost != 1 {
		t.Errorf("lost settlements counted %d (observer %d), want 1", lost, obs.lost)
	}
}

// settleCounter counts settlements an observer learns of.
type settleCounter struct {
	nopObserver
	charged, lost int
}

func (c *settleCounter) Settled(_ *Rule, tokens int64, err error) {
	if err != nil {
		c.lost++
	} else if tokens > 0 {
		c.charged++
	}
}

// nopObserver is an Observer that ignores everything.
type nopObserver struct{}

func (nopObserver) StoreDecided(time.Duration, error) {}
func (nopObserver) CacheDenied(*Rule)                 {}
func (nopObserver) Refunded(*Rule, error)             {}

// TestSettleLocal: a request that the local fallback admitted during an
// outage settles on its local bucket, and the outage's ledger carries the
// difference to Redis when it answers again.
func TestSettleLocal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, r := outageLimiter(t, srv) // 10/s, burst 10, two nodes: 5 locally
	srv.Pause()
	ctx := context.Background()
	var reqs []Request
	var res []Result
	for range 100 {
		reqs, res = []Request{{Rule: r, Key: "llm", Cost: 1}}, make([]Result, 1)
		if out := l.Decide(ctx, reqs, res); out == LocalAllowed {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := l.Settle(ctx, LocalAllowed, reqs[0], res[0], 4)
	if err != nil || !st.Local || st.Tokens != 3 {
		t.Fatalf("local settlement: %+v, %v", st, err)
	}
	l.out.mu.Lock()
	e := l.out.entries[outageKey{r.bucket, "llm"}]
	admitted := int64(-1)
	if e != nil {
		admitted = e.admitted
	}
	l.out.mu.Unlock()
	if admitted != 4 {
		t.Fatalf("the ledger holds %d tokens for the key, want 4 (1 admitted + 3 settled)", admitted)
	}
	// The local bucket (5 tokens) holds 1 more: the next admits, the one
	// after is denied.
	outs := ""
	for range 2 {
		outs += fmt.Sprint(l.Decide(ctx, []Request{{Rule: r, Key: "llm", Cost: 1}}, make([]Result, 1)), " ")
	}
	if outs != "local_allowed local_denied " {
		t.Fatalf("after the local settlement: %s, want local_allowed local_denied", outs)
	}
	srv.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l.Decide(ctx, []Request{{Rule: r, Key: "other", Cost: 1}}, make([]Result, 1))
		if charged, pending, _ := l.OutageCharges(); charged > 0 && pending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	charged, pending, _ := l.OutageCharges()
	t.Logf("after the outage: %d keys charged, %d pending", charged, pending)
	if charged == 0 || pending != 0 {
		t.Fatalf("the ledger was not charged to Redis: %d charged, %d pending", charged, pending)
	}

}

// TestSettleFromSpares: a request admitted from a node's prefetched
// spares settles on the shared bucket, as any other: another node sees
// the charge at once.
func TestSettleFromSpares(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clk := newTestClock(epoch + 3e12)
	r := mustConfig(t, RuleConfig{Name: "hot", Rate: 100, Per: time.Second, Burst: 100, Prefetch: 10, Refunds: true})
	a := New(newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "sp:", Clock: clk}), Options{})
	b := New(newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "sp:", Clock: clk}), Options{})
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	ctx := context.Background()
	res := make([]Result, 1)
	if out := a.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Allowed || res[0].spares != 9 {
		t.Fatalf("the first request: %s, %d spares; want allowed with 9", out, res[0].spares)
	}
	q := Request{Rule: r, Key: "k", Cost: 1}
	if out := a.Decide(ctx, []Request{q}, res); out != Allowed {
		t.Fatalf("the second request: %s", out)
	}
	if hits := a.PrefetchStats(r).Hits; hits != 1 {
		t.Fatalf("the second request was not admitted from the spares: %d hits", hits)
	}
	if st, err := a.Settle(ctx, Allowed, q, res[0], 51); err != nil || st.Tokens != 50 {
		t.Fatalf("settling a request admitted from spares: %+v, %v", st, err)
	}
	// Redis: 1 + 9 spares + 50 settled owed; the other node's request
	// leaves 100 - 61 = 39 (Remaining counts the spares it takes).
	if out := b.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Allowed || res[0].Remaining != 39 {
		t.Fatalf("another node after the settlement: %s, %d left; want 39", out, res[0].Remaining)
	}
}
