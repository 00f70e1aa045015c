package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func mustAlgRule(t testing.TB, name string, alg Algorithm, rate int64, per time.Duration, burst int64, maxDelay time.Duration) *Rule {
	t.Helper()
	return mustConfig(t, RuleConfig{Name: name, Algorithm: alg, Rate: rate, Per: per, Burst: burst, MaxDelay: maxDelay})
}

// TestAlgorithmsRedisMatchesMemory replays random traces (times, keys,
// costs, requests of several zones of every algorithm) through the Redis
// script and the memory store: every decision, remaining count, retry and
// reset time, and delay is the same.
func TestAlgorithmsRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rules := algorithmTraceRules(t)
	decisions := 2500
	if raceEnabled {
		decisions = 1200
	}
	for seed := range 3 {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			counts := map[string]int{}
			next := randomAlgorithmRequests(rules, []string{"198.51.100.7", "2001:db8::1", "user@example.com"})
			seen := func(reqs []Request, ok bool, got []Result) { countOutcomes(counts, reqs, ok, got) }
			replayTrace(t, srv, fmt.Sprintf("alg%d:", seed), uint64(seed), 7, decisions, false, next, seen)
			t.Logf("%d decisions: %v", decisions, counts)
			for _, a := range []Algorithm{SlidingWindow, FixedWindow, SlidingLog, LeakyBucket} {
				if counts[a.String()+" admitted"] == 0 || counts[a.String()+" denied"] == 0 {
					t.Errorf("the trace did not both admit and deny with %s", a)
				}
			}
			if counts["leaky_bucket delayed"] == 0 {
				t.Error("the trace never delayed a leaky bucket request")
			}
		})
	}
}

// algorithmTraceRules are the zones TestAlgorithmsRedisMatchesMemory
// draws from: every algorithm, narrow and wide. Windows of at least 10 s:
// a window state carries its window index modulo 1024, and the simulated
// clock runs far faster than the real one that expires Redis keys; 1024
// windows must outlast the run.
func algorithmTraceRules(t *testing.T) []*Rule {
	return []*Rule{
		mustAlgRule(t, "fw10", FixedWindow, 5, 10*time.Second, 0, 0),
		mustAlgRule(t, "fw1h", FixedWindow, 100, time.Hour, 0, 0),
		// Counts beyond the packed counters' 21 bits (a wide state).
		mustAlgRule(t, "fwwide", FixedWindow, 3_000_000, 10*time.Second, 0, 0),
		mustAlgRule(t, "fwmonth", FixedWindow, 4_000_000, 30*24*time.Hour, 0, 0),
		mustAlgRule(t, "sw10", SlidingWindow, 4, 10*time.Second, 0, 0),
		mustAlgRule(t, "sw1m", SlidingWindow, 30, time.Minute, 0, 0),
		mustAlgRule(t, "sw1d", SlidingWindow, 1000, 24*time.Hour, 0, 0),
		mustAlgRule(t, "log2", SlidingLog, 3, 2*time.Second, 0, 0),
		mustAlgRule(t, "log1m", SlidingLog, 10, time.Minute, 0, 0),
		mustAlgRule(t, "lb", LeakyBucket, 5, time.Second, 4, 0),
		mustAlgRule(t, "lbd", LeakyBucket, 3, time.Second, 10, 700*time.Millisecond),
		mustAlgRule(t, "lb7", LeakyBucket, 7, time.Second, 3, 200*time.Millisecond),
		mustRule(t, "tb", 3, time.Second, 3),
	}
}

// randomAlgorithmRequests returns a trace step for replayTrace: the clock
// moves by nothing, a little or a lot, and one key asks one to three
// zones at once, mostly for 1, sometimes for 0, up to the burst, or one
// more than the burst.
func randomAlgorithmRequests(rules []*Rule, keys []string) func(*rand.Rand, *testClock) []Request {
	return func(rng *rand.Rand, clk *testClock) []Request {
		switch x := rng.IntN(10); {
		case x < 4:
		case x < 7:
			clk.add(rng.Int64N(100_000))
		case x < 9:
			clk.add(rng.Int64N(1_500_000))
		default:
			clk.add(rng.Int64N(20_000_000))
		}
		zones := rng.Perm(len(rules))[:1+rng.IntN(3)]
		reqs := make([]Request, len(zones))
		key := keys[rng.IntN(len(keys))]
		for i, z := range zones {
			r := rules[z]
			var cost int64
			switch x := rng.IntN(20); {
			case x < 12:
				cost = 1
			case x < 14:
				cost = 0
			case x < 19:
				cost = rng.Int64N(r.burst + 1)
			default:
				cost = r.burst + 1
			}
			reqs[i] = Request{Rule: r, Key: key, Cost: cost}
		}
		return reqs
	}
}

// countOutcomes counts each request's outcome by algorithm: "delayed",
// "admitted", "never" or "denied".
func countOutcomes(counts map[string]int, reqs []Request, ok bool, got []Result) {
	for i, q := range reqs {
		switch {
		case ok && got[i].Delay > 0:
			counts[q.Rule.alg.String()+" delayed"]++
		case ok:
			counts[q.Rule.alg.String()+" admitted"]++
		case !got[i].Allowed && got[i].RetryAfter == Never:
			counts[q.Rule.alg.String()+" never"]++
		case !got[i].Allowed:
			counts[q.Rule.alg.String()+" denied"]++
		}
	}
}

// TestWindowAlgorithms checks each window algorithm's meaning on a fixed
// clock.
func TestWindowAlgorithms(t *testing.T) {
	t.Parallel()
	t.Run("fixed window", checkFixedWindowMeaning)
	t.Run("sliding window", checkSlidingWindowMeaning)
	t.Run("sliding log", checkSlidingLogMeaning)
	t.Run("leaky bucket", checkLeakyBucketMeaning)
}

// decideForK decides one request of key "k" for cost on s.
func decideForK(t *testing.T, s Store, r *Rule, cost int64) (bool, Result) {
	t.Helper()
	res := make([]Result, 1)
	ok, err := s.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: cost}}, res)
	if err != nil {
		t.Fatal(err)
	}
	return ok, res[0]
}

// checkFixedWindowMeaning: windows aligned to the clock, 5 per 10 s from
// a window start.
func checkFixedWindowMeaning(t *testing.T) {
	clk := newTestClock(1_700_000_000_000_000) // a multiple of 10 s
	s := newMemory(t, clk)
	r := mustAlgRule(t, "fw", FixedWindow, 5, 10*time.Second, 0, 0)
	clk.add(3_000_000)
	for i := range 5 {
		if ok, res := decideForK(t, s, r, 1); !ok || res.Remaining != int64(4-i) || res.ResetAfter != 7*time.Second {
			t.Fatalf("request %d: %v %+v", i, ok, res)
		}
	}
	ok, res := decideForK(t, s, r, 1)
	if ok || res.RetryAfter != 7*time.Second {
		t.Fatalf("6th: %v %+v, want denied until the window ends in 7s", ok, res)
	}
	clk.add(7_000_000) // the next window: all 5 again
	for i := range 5 {
		if ok, _ := decideForK(t, s, r, 1); !ok {
			t.Fatalf("next window, request %d denied", i)
		}
	}
}

// checkSlidingWindowMeaning: the previous window weighs by the share of
// it still inside the sliding window.
func checkSlidingWindowMeaning(t *testing.T) {
	clk := newTestClock(1_700_000_000_000_000)
	s := newMemory(t, clk)
	r := mustAlgRule(t, "sw", SlidingWindow, 10, 10*time.Second, 0, 0)
	clk.add(5_000_000) // half way through a window: spend all 10
	for range 10 {
		if ok, _ := decideForK(t, s, r, 1); !ok {
			t.Fatal("the first 10 must pass")
		}
	}
	ok, res := decideForK(t, s, r, 1)
	if ok {
		t.Fatal("the 11th must be denied")
	}
	// In the next window the previous 10 weigh (10s-e)/10s: one
	// request fits once 10*(10-e)/10 <= 9, i.e. from e = 1 s: 6 s
	// from now.
	if res.RetryAfter != 6*time.Second {
		t.Fatalf("RetryAfter %s, want 6s", res.RetryAfter)
	}
	clk.add(6_000_000 - 1)
	if ok, _ := decideForK(t, s, r, 1); ok {
		t.Fatal("admitted 1us before RetryAfter")
	}
	clk.add(1)
	if ok, _ := decideForK(t, s, r, 1); !ok {
		t.Fatal("denied at RetryAfter")
	}
}

// checkSlidingLogMeaning: never more than 3 in any window of 10 s, to the
// microsecond.
func checkSlidingLogMeaning(t *testing.T) {
	clk := newTestClock(1_700_000_000_000_000)
	s := newMemory(t, clk)
	r := mustAlgRule(t, "sl", SlidingLog, 3, 10*time.Second, 0, 0)
	for i := range 3 { // at 0, 4 and 8 s
		if ok, _ := decideForK(t, s, r, 1); !ok {
			t.Fatalf("request %d denied", i)
		}
		clk.add(4_000_000)
	}
	// at 12 s: the one at 0 s has left the window (0, 12]... no:
	// the window is (2, 12], so 4 s and 8 s remain and one fits.
	if ok, _ := decideForK(t, s, r, 1); !ok {
		t.Fatal("at 12 s one request fits")
	}
	ok, res := decideForK(t, s, r, 1)
	if ok || res.RetryAfter != 2*time.Second {
		t.Fatalf("at 12 s, the 2nd: %v %+v, want denied until the entry of 4 s leaves (2 s)", ok, res)
	}
	// In any window of 10 s, never more than 3: check every
	// microsecond boundary around the retry.
	clk.add(2_000_000 - 1)
	if ok, _ := decideForK(t, s, r, 1); ok {
		t.Fatal("admitted 1us early")
	}
	clk.add(1)
	if ok, _ := decideForK(t, s, r, 1); !ok {
		t.Fatal("denied at RetryAfter")
	}
}

// checkLeakyBucketMeaning: requests wait their turn up to max_delay, and
// the queue's size binds when it is the smaller bound.
func checkLeakyBucketMeaning(t *testing.T) {
	clk := newTestClock(1_700_000_000_000_000)
	s := newMemory(t, clk)
	r := mustAlgRule(t, "lb", LeakyBucket, 4, time.Second, 10, 600*time.Millisecond)
	// Four at once: the first goes now, the next wait 250, 500 ms;
	// the fourth would wait 750 ms > max_delay: denied.
	for i, want := range []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond} {
		ok, res := decideForK(t, s, r, 1)
		if !ok || res.Delay != want {
			t.Fatalf("request %d: %v delay %s, want admitted after %s", i, ok, res.Delay, want)
		}
	}
	ok, res := decideForK(t, s, r, 1)
	if ok || res.RetryAfter != 150*time.Millisecond {
		t.Fatalf("4th: %v %+v, want denied, retry when its wait is 600ms (in 150ms)", ok, res)
	}
	// With a queue of 3 tokens the queue binds first: the 4th waits
	// for the first queued request to leave (250 ms).
	q := mustAlgRule(t, "lbq", LeakyBucket, 4, time.Second, 3, 600*time.Millisecond)
	for range 3 {
		decideForK(t, s, q, 1)
	}
	if ok, res := decideForK(t, s, q, 1); ok || res.RetryAfter != 250*time.Millisecond {
		t.Fatalf("queue of 3, 4th: %v %+v, want denied for 250ms", ok, res)
	}
}

// TestBytesPerKeyByAlgorithm measures each algorithm's state per active
// key: Redis MEMORY USAGE of one bucket with a 20-byte client key, and the
// memory store's heap per key over many keys. The sliding log keeps one
// entry per admitted request in the window: it is measured with 10.
func TestBytesPerKeyByAlgorithm(t *testing.T) {
	// Not parallel: the heap is measured.
	srv := redistest.Start(t)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr})
	ctx := context.Background()
	n := 200_000
	if raceEnabled {
		n = 50_000
	}
	for _, tc := range []struct {
		rule     *Rule
		requests int
		redisMax int // bytes
		memMax   float64
	}{
		{mustRule(t, "api", 100, time.Minute, 0), 1, 80, 128},
		{mustAlgRule(t, "api", LeakyBucket, 100, time.Minute, 10, 0), 1, 80, 128},
		{mustAlgRule(t, "api", FixedWindow, 100, time.Minute, 0, 0), 1, 80, 128},
		{mustAlgRule(t, "api", SlidingWindow, 100, time.Minute, 0, 0), 1, 80, 128},
		{mustAlgRule(t, "api", SlidingLog, 100, time.Minute, 0, 0), 10, 1200, 700},
	} {
		r := tc.rule
		key := "k-0123456789abcdef01" // 20 bytes
		reqs := []Request{{Rule: r, Key: key, Cost: 1}}
		res := make([]Result, 1)
		for range tc.requests {
			if ok, err := rs.Decide(ctx, reqs, res); !ok || err != nil {
				t.Fatalf("%s: %v %v", r.alg, ok, err)
			}
		}
		redisKey := rs.Key(r.bucket, key)
		usage, _ := strconv.Atoi(srv.MustDo("MEMORY", "USAGE", redisKey))
		enc := srv.MustDo("OBJECT", "ENCODING", redisKey)
		srv.MustDo("DEL", redisKey)

		clk := newTestClock(epoch)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ms := NewMemoryStore(MemoryOptions{Sweep: time.Hour, Clock: clk})
		for _, k := range keys {
			reqs[0].Key = k
			for range tc.requests {
				if ok, _ := ms.Decide(ctx, reqs, res); !ok {
					t.Fatalf("%s: memory store denied key %s", r.alg, k)
				}
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		runtime.KeepAlive(keys)
		_ = ms.Close()
		t.Logf("%-14s Redis MEMORY USAGE %4d bytes (%s, %d request(s) in the window); memory store %6.1f bytes per key over %d keys",
			r.alg, usage, enc, tc.requests, perKey, n)
		if usage > tc.redisMax {
			t.Errorf("%s: %d bytes in Redis, want at most %d", r.alg, usage, tc.redisMax)
		}
		if perKey > tc.memMax {
			t.Errorf("%s: %.1f bytes per key in memory, want at most %.0f", r.alg, perKey, tc.memMax)
		}
	}
}

// TestAlgorithmChangeStartsFresh: a zone that keeps its name but changes
// its algorithm family in a reload finds no state of the other family, in
// Redis and in memory: bucket times (token and leaky bucket), window
// counters (fixed and sliding window) and sliding logs never misread each
// other. Within a family the state keeps its meaning and carries over.
func TestAlgorithmChangeStartsFresh(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clk := newTestClock(epoch)
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: clk})
	ms := newMemory(t, clk)
	ctx := context.Background()
	tb := mustRule(t, "z", 1, time.Hour, 5)
	lb := mustAlgRule(t, "z", LeakyBucket, 1, time.Hour, 5, 5*time.Hour) // max_delay: the whole queue
	fw := mustAlgRule(t, "z", FixedWindow, 5, time.Hour, 0, 0)
	sw := mustAlgRule(t, "z", SlidingWindow, 5, time.Hour, 0, 0)
	sl := mustAlgRule(t, "z", SlidingLog, 5, time.Hour, 0, 0)
	pairs := [][2]*Rule{{tb, fw}, {tb, sw}, {fw, tb}, {sw, lb}, {lb, fw}, {tb, sl}, {sl, tb}, {sl, sw}, {fw, sl}}
	for _, s := range []Store{rs, ms} {
		spend := func(r *Rule, key string, n int) Result {
			res := make([]Result, 1)
			for range n {
				if _, err := s.Decide(ctx, []Request{{Rule: r, Key: key, Cost: 1}}, res); err != nil {
					t.Fatal(err)
				}
			}
			return res[0]
		}
		for i, p := range pairs {
			key := fmt.Sprintf("%T-%d", s, i)
			spend(p[0], key, 4)
			clk.add(1)
			if res := spend(p[1], key, 4); !res.Allowed || res.Remaining != 1 {
				t.Errorf("%s: %s then %s: %+v, want a fresh limit (4 admitted, 1 left)", key, p[0].alg, p[1].alg, res)
			}
		}
		// Within a family: the leaky bucket sees what the token bucket owes.
		key := fmt.Sprintf("%T-family", s)
		spend(tb, key, 4)
		if res := spend(lb, key, 1); !res.Allowed || res.Delay < 3*time.Hour {
			t.Errorf("%s: token bucket then leaky bucket: %+v, want the debt of 4 tokens to carry over as a wait", key, res)
		}
	}
}
