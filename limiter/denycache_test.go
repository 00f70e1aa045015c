package limiter

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingStore is a real store that counts its calls and can take time to
// answer, like a store across a network: half the delay on the way there,
// half on the way back.
type countingStore struct {
	Store
	calls atomic.Int64
	delay time.Duration
}

func (s *countingStore) Decide(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	s.calls.Add(1)
	if s.delay > 0 {
		time.Sleep(s.delay / 2)
		defer time.Sleep(s.delay / 2)
	}
	return s.Store.Decide(ctx, reqs, results)
}

// TestDenyCacheIsExact replays one random trace through a limiter without a
// cache and one with: every decision must be the same, and a zone that
// denied reports the same numbers.
func TestDenyCacheIsExact(t *testing.T) {
	t.Parallel()
	clkA, clkB := newTestClock(epoch), newTestClock(epoch)
	plain := New(newMemory(t, clkA), Options{})
	inner := &countingStore{Store: newMemory(t, clkB)}
	cache := NewDenyCache(DenyCacheOptions{Clock: clkB})
	cached := New(inner, Options{Cache: cache})

	rules := []*Rule{
		mustRule(t, "a", 3, time.Second, 3),
		mustRule(t, "b", 100, time.Minute, 5),
		mustRule(t, "c", 12345, time.Second, 50),
	}
	keys := []string{"k1", "k2", "k3"}
	rng := rand.New(rand.NewPCG(1, 2))
	resA, resB := make([]Result, 2), make([]Result, 2)
	const n = 200_000
	for i := range n {
		step := rng.Int64N(20_000)
		clkA.add(step)
		clkB.add(step)
		r1, r2 := rules[rng.IntN(len(rules))], rules[rng.IntN(len(rules))]
		reqs := []Request{{Rule: r1, Key: keys[rng.IntN(len(keys))], Cost: 1 + rng.Int64N(3)}}
		if r2 != r1 {
			reqs = append(reqs, Request{Rule: r2, Key: keys[rng.IntN(len(keys))], Cost: rng.Int64N(3)})
		}
		a := plain.Decide(context.Background(), reqs, resA[:len(reqs)])
		b := cached.Decide(context.Background(), reqs, resB[:len(reqs)])
		if a != b {
			t.Fatalf("decision %d (%v): without cache %v, with cache %v", i, reqs, a, b)
		}
		for z := range reqs {
			if resB[z].Unknown {
				continue
			}
			ra, rb := resA[z], resB[z]
			ra.owed, rb.owed, ra.at, rb.at = 0, 0, 0, 0
			if ra != rb && !ra.Allowed {
				t.Fatalf("decision %d zone %d: without cache %+v, with cache %+v", i, z, ra, rb)
			}
		}
	}
	saved := n - inner.calls.Load()
	t.Logf("%d decisions: %d answered by the deny cache (%d hits), %d by the store", n, saved, cache.Hits(), inner.calls.Load())
	if saved == 0 || cache.Hits() != uint64(saved) {
		t.Fatalf("the cache answered %d decisions and counted %d hits", saved, cache.Hits())
	}
}

// TestDenyCacheFloodCostsOneCallPerRefill floods one key from many
// goroutines through a store that takes a millisecond to answer: the store
// sees about one call per refill interval, and the admitted count is exact.
func TestDenyCacheFloodCostsOneCallPerRefill(t *testing.T) {
	t.Parallel()
	inner := &countingStore{Store: NewMemoryStore(MemoryOptions{Sweep: time.Minute}), delay: time.Millisecond}
	t.Cleanup(func() { _ = inner.Store.(*MemoryStore).Close() })
	cache := NewDenyCache(DenyCacheOptions{})
	l := New(inner, Options{Cache: cache})
	rule := mustRule(t, "flood", 10, time.Second, 5) // a token every 100 ms
	const duration = 1500 * time.Millisecond
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := []Request{{Rule: rule, Key: "victim", Cost: 1}}
			res := make([]Result, 1)
			for time.Since(start) < duration {
				if l.Decide(context.Background(), reqs, res) == Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := 5 + int64(elapsed/(100*time.Millisecond))
	calls := inner.calls.Load()
	t.Logf("%s of flood: %d admitted (bound %d), %d store calls, %d cache hits", elapsed.Round(time.Millisecond), admitted.Load(), bound, calls, cache.Hits())
	// Never over the bound; under it only by what a busy machine's
	// scheduling costs (a probe that runs late lets a token wait): the
	// cache must not starve the key, but a 2-core machine running other
	// tests can delay the flood's goroutines by tens of milliseconds.
	if admitted.Load() > bound || admitted.Load() < bound*2/3 {
		t.Errorf("admitted %d, want the bound %d (at least two thirds of it on a busy machine)", admitted.Load(), bound)
	}
	// About one call per refill (15 in 1.5 s), plus the first burst of 5.
	// The cache learns a bucket's state as of when the request was sent,
	// which is earlier than when the store decided by the way there, so a
	// probe can come a little early and be denied once more: at most a
	// few calls per token, against the flood's hundreds of thousands of
	// requests.
	if maxCalls := 3*bound + 5; calls > maxCalls {
		t.Errorf("%d store calls for %d admissions, want at most %d", calls, admitted.Load(), maxCalls)
	}
}

// TestDenyCacheOtherKeysUnaffected checks that a cached denial of one key
// answers nothing for another.
func TestDenyCacheOtherKeysUnaffected(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	inner := &countingStore{Store: newMemory(t, clk)}
	cache := NewDenyCache(DenyCacheOptions{Clock: clk})
	l := New(inner, Options{Cache: cache})
	rule := mustRule(t, "z", 1, time.Hour, 1)
	res := make([]Result, 1)
	decide := func(key string) Outcome {
		return l.Decide(context.Background(), []Request{{Rule: rule, Key: key, Cost: 1}}, res)
	}
	if decide("a") != Allowed || decide("a") != Denied || decide("a") != Denied {
		t.Fatal("a: want admitted, denied, denied")
	}
	// "a" was admitted with nothing left, so the cache knew it was empty
	// from the first answer: only that one call reached the store.
	if c := inner.calls.Load(); c != 1 {
		t.Fatalf("store calls for a: %d, want 1", c)
	}
	if res[0].RetryAfter != time.Hour || res[0].Remaining != 0 {
		t.Fatalf("cached denial: %+v, want RetryAfter 1h, Remaining 0", res[0])
	}
	if decide("b") != Allowed {
		t.Fatal("b must not be denied by a's entry")
	}
	clk.add(int64(time.Hour / time.Microsecond))
	if decide("a") != Allowed {
		t.Fatal("a must pass once its token is back")
	}
}

// TestDenyCacheCostMatters: a denial learned for a large cost does not deny
// a smaller request that the bucket can serve.
func TestDenyCacheCostMatters(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	cache := NewDenyCache(DenyCacheOptions{Clock: clk})
	l := New(newMemory(t, clk), Options{Cache: cache})
	rule := mustRule(t, "z", 10, time.Hour, 10)
	res := make([]Result, 1)
	decide := func(cost int64) Outcome {
		return l.Decide(context.Background(), []Request{{Rule: rule, Key: "k", Cost: cost}}, res)
	}
	if decide(7) != Allowed || decide(5) != Denied {
		t.Fatal("want 7 admitted, then 5 denied with 3 left")
	}
	if decide(3) != Allowed {
		t.Fatal("3 tokens are left: a request of 3 must pass")
	}
	if decide(1) != Denied || cache.Hits() == 0 {
		t.Fatalf("empty now: want a cached denial (hits %d)", cache.Hits())
	}
}

// TestDenyCacheBounded fills the cache with more denied keys than it holds.
func TestDenyCacheBounded(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	cache := NewDenyCache(DenyCacheOptions{Size: 256, Clock: clk})
	l := New(newMemory(t, clk), Options{Cache: cache})
	rule := mustRule(t, "z", 1, time.Hour, 1)
	res := make([]Result, 1)
	for i := range 20_000 {
		key := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
		l.Decide(context.Background(), []Request{{Rule: rule, Key: key, Cost: 1}}, res)
		l.Decide(context.Background(), []Request{{Rule: rule, Key: key, Cost: 1}}, res)
	}
	if n := cache.Len(); n > 256 || n < 64 {
		t.Fatalf("cache holds %d buckets, want at most 256 (and some)", n)
	}
}

// TestLastStateOnlyForLocalPolicy: the deny cache keeps a bucket's last
// state for a zone that falls back to local buckets, and not for one that
// fails open or closed, which would never read it.
func TestLastStateOnlyForLocalPolicy(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	cache := NewDenyCache(DenyCacheOptions{Clock: clk})
	l := New(newMemory(t, clk), Options{Cache: cache})
	for _, c := range []struct {
		policy Policy
		kept   bool
	}{{PolicyLocal, true}, {PolicyAllow, false}, {PolicyDeny, false}} {
		r := mustConfig(t, RuleConfig{Name: "z" + c.policy.String(), Rate: 10, Per: time.Second, Burst: 10, OnError: c.policy})
		res := make([]Result, 1)
		if out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 4}}, res); out != Allowed {
			t.Fatalf("on_error %s: %v, want allowed", c.policy, out)
		}
		owed, kept := cache.lastOwed(r, "k")
		if kept != c.kept {
			t.Errorf("on_error %s: last state kept %v, want %v", c.policy, kept, c.kept)
		}
		if kept && owed <= 0 {
			t.Errorf("on_error %s: the bucket owes %d µs after 4 of 10 tokens, want more than 0", c.policy, owed)
		}
	}
}
