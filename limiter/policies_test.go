package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The policies' arithmetic on a controlled clock, each test run on the
// memory store and on a Redis store whose script reads the same kind of
// clock: reserves, dry runs, bans (and the deny cache's part in them),
// concurrency slots and refunds.

// policyStore is a store under test and its controlled clock: the memory
// store, or a Redis store whose script reads the clock (RedisOptions.Clock).
type policyStore struct {
	Store
	clk *testClock
	ms  *MemoryStore // nil on Redis
	rs  *RedisStore  // nil in memory
}

// eachStore runs f as two parallel subtests, "memory" and "redis" (on a
// redis-server started for the test), each on a store of its own whose
// clock starts at start.
func eachStore(t *testing.T, start int64, f func(t *testing.T, s *policyStore)) {
	t.Helper()
	srv := redistest.Start(t)
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		clk := newTestClock(start)
		ms := newMemory(t, clk)
		f(t, &policyStore{Store: ms, clk: clk, ms: ms})
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		clk := newTestClock(start)
		rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: clk})
		f(t, &policyStore{Store: rs, clk: clk, rs: rs})
	})
}

// decide decides one request of the zones reqs and fails the test on a
// store error.
func decide(t testing.TB, s Store, reqs ...Request) (bool, []Result) {
	t.Helper()
	res := make([]Result, len(reqs))
	ok, err := s.Decide(context.Background(), reqs, res)
	if err != nil {
		t.Fatalf("Decide(%s): %v", describePolicies(reqs), err)
	}
	return ok, res
}

// decideTimes decides reqs n times and returns each time's results, to
// refund later.
func decideTimes(t testing.TB, s Store, n int, reqs ...Request) [][]Result {
	t.Helper()
	charged := make([][]Result, n)
	for i := range charged {
		_, charged[i] = decide(t, s, reqs...)
	}
	return charged
}

// refund refunds the charges of zones reqs, decided with results, and
// fails the test on a store error.
func refund(t testing.TB, s Store, reqs []Request, results []Result) {
	t.Helper()
	if err := s.Refund(context.Background(), reqs, results); err != nil {
		t.Fatalf("Refund(%s): %v", describePolicies(reqs), err)
	}
}

// stored returns what the store counts for the key in r's zone at the
// clock's time: the requests of the current window (fixed window), the
// entries in the window (sliding log), or the slots held (concurrency).
func (s *policyStore) stored(t testing.TB, r *Rule, key string) int64 {
	t.Helper()
	now := s.clk.now()
	if s.rs != nil {
		ctx, k := context.Background(), s.rs.Key(r.bucket, key)
		switch r.alg {
		case SlidingLog:
			n, err := s.rs.Client().ZCount(ctx, k, "("+itoa(now-r.windowUS), "+inf").Result()
			if err != nil {
				t.Fatalf("ZCOUNT %s: %v", k, err)
			}
			return n
		case Concurrency:
			n, err := s.rs.Client().ZCount(ctx, k, "("+itoa(now), "+inf").Result()
			if err != nil {
				t.Fatalf("ZCOUNT %s: %v", k, err)
			}
			return n
		}
		v, _ := s.rs.Client().Get(ctx, k).Int64()
		_, curr, _ := r.windowCounts(State(v), now)
		return curr
	}
	id := s.ms.hash.id(r.bucket, key)
	sh := &s.ms.shards[id.shard()]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	switch r.alg {
	case SlidingLog:
		n := int64(0)
		if lb := sh.logs[id]; lb != nil {
			for _, e := range lb.entries {
				if e.t > now-r.windowUS {
					n++
				}
			}
		}
		return n
	case Concurrency:
		e, _ := sh.m.get(id)
		return int64(e.state)
	}
	e, _ := sh.m.get(id)
	_, curr, _ := r.windowCounts(e.state, now)
	return curr
}

// windowStart returns the start of the window of length w that holds the
// microsecond t.
func windowStart(t int64, w time.Duration) int64 {
	return t - t%int64(w/time.Microsecond)
}

// TestReserveShedsLowerPriorityFirst drains a bucket of 10 at one instant
// with requests of three priorities in turn, reserving 0%, 30% and 60%:
// each class is admitted while the bucket keeps its reserve after the
// charge (6, 3 and 1 of the 10), the last token goes to reserve 0, and a
// shed request's Retry-After is exactly when the bucket holds its reserve
// and its cost again, for every algorithm but concurrency.
func TestReserveShedsLowerPriorityFirst(t *testing.T) {
	t.Parallel()
	// 15s into a minute, so that the windows' waits are easy to state.
	start := windowStart(epoch, time.Minute) + 15_000_000
	cases := []struct {
		cfg RuleConfig
		// retry is the Retry-After of a reserve-30 request once the
		// bucket is empty: 4 tokens of 6s for the buckets; the
		// window's end for the fixed window; for the sliding window,
		// the next window's 40% mark, where 10 x 60% + 4 <= 10; the
		// window for the sliding log, whose entries all leave then.
		retry time.Duration
	}{
		{RuleConfig{Name: "tb", Rate: 10, Per: time.Minute}, 24 * time.Second},
		{RuleConfig{Name: "lb", Algorithm: LeakyBucket, Rate: 10, Per: time.Minute, MaxDelay: time.Minute}, 24 * time.Second},
		{RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 10, Per: time.Minute}, 45 * time.Second},
		{RuleConfig{Name: "sw", Algorithm: SlidingWindow, Rate: 10, Per: time.Minute}, 45*time.Second + 24*time.Second},
		{RuleConfig{Name: "log", Algorithm: SlidingLog, Rate: 10, Per: time.Minute}, time.Minute},
	}
	eachStore(t, start, func(t *testing.T, s *policyStore) {
		for _, c := range cases {
			r := mustConfig(t, c.cfg)
			classes := []int64{0, 30, 60}
			admitted := map[int64]int{}
			for round := 0; ; round++ {
				passed := false
				for _, pct := range classes {
					ok, res := decide(t, s, Request{Rule: r, Key: "k", Cost: 1, Reserve: pct})
					if ok != res[0].Allowed || res[0].RetryAfter == Never {
						t.Fatalf("%s round %d reserve %d%%: %v %+v", r.name, round, pct, ok, res[0])
					}
					if ok {
						admitted[pct]++
						passed = true
					}
				}
				if !passed {
					break
				}
			}
			if admitted[0] != 6 || admitted[30] != 3 || admitted[60] != 1 {
				t.Fatalf("%s: admitted by reserve %v, want 0%%: 6, 30%%: 3, 60%%: 1", r.name, admitted)
			}
			_, res := decide(t, s, Request{Rule: r, Key: "k", Cost: 1, Reserve: 30})
			if res[0].Allowed || res[0].RetryAfter != c.retry {
				t.Fatalf("%s: a shed reserve-30 request: %+v, want Retry-After %s", r.name, public(res[0]), c.retry)
			}
			s.clk.add(int64(c.retry/time.Microsecond) - 1)
			if ok, res := decide(t, s, Request{Rule: r, Key: "k", Cost: 1, Reserve: 30}); ok {
				t.Fatalf("%s: admitted 1us before its Retry-After: %+v", r.name, public(res[0]))
			}
			s.clk.add(1)
			if ok, res := decide(t, s, Request{Rule: r, Key: "k", Cost: 1, Reserve: 30}); !ok {
				t.Fatalf("%s: denied at its Retry-After: %+v", r.name, public(res[0]))
			}
			s.clk.set(start)
		}
	})
}

// TestReserveNever: a request whose cost and reserve exceed the zone's
// capacity can never pass (Retry-After Never); one that fits exactly
// passes a full bucket; concurrency zones take no reserve.
func TestReserveNever(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		for _, cfg := range []RuleConfig{
			{Name: "tb", Rate: 10, Per: time.Minute},
			{Name: "lb", Algorithm: LeakyBucket, Rate: 10, Per: time.Minute},
			{Name: "fw", Algorithm: FixedWindow, Rate: 10, Per: time.Minute},
			{Name: "sw", Algorithm: SlidingWindow, Rate: 10, Per: time.Minute},
			{Name: "log", Algorithm: SlidingLog, Rate: 10, Per: time.Minute},
		} {
			r := mustConfig(t, cfg)
			// 99% of 10 is 9.9, rounded up: with a cost of 1, more
			// than the 10 there are.
			ok, res := decide(t, s, Request{Rule: r, Key: "never", Cost: 1, Reserve: 99})
			if ok || res[0].RetryAfter != Never {
				t.Fatalf("%s: reserve 99%%, cost 1: %v %+v, want Never", r.name, ok, public(res[0]))
			}
			if ok, res := decide(t, s, Request{Rule: r, Key: "never", Cost: 2, Reserve: 90}); ok || res[0].RetryAfter != Never {
				t.Fatalf("%s: reserve 90%%, cost 2: %v %+v, want Never", r.name, ok, public(res[0]))
			}
			if ok, res := decide(t, s, Request{Rule: r, Key: "fits", Cost: 1, Reserve: 90}); !ok || res[0].Remaining != 9 {
				t.Fatalf("%s: reserve 90%%, cost 1, on a full bucket: %v %+v, want admitted", r.name, ok, public(res[0]))
			}
		}
		cc := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 2})
		for i := range 2 {
			if ok, res := decide(t, s, Request{Rule: cc, Key: "k", Cost: 1, Reserve: 99, Slot: itoa(int64(i))}); !ok {
				t.Fatalf("concurrency with a reserve of 99%%: slot %d denied: %+v", i, public(res[0]))
			}
		}
	})
}

// TestReserveUnits: a reserve is rounded up into the algorithm's units,
// capped at 99%, and none for concurrency; 25% of a window of 10 leaves 3.
func TestReserveUnits(t *testing.T) {
	t.Parallel()
	tb := mustConfig(t, RuleConfig{Name: "tb", Rate: 10, Per: time.Minute}) // a token is 6,000,000 ticks
	fw := mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 10, Per: time.Minute})
	odd := mustConfig(t, RuleConfig{Name: "odd", Rate: 3, Per: 7 * time.Microsecond}) // 3 ticks a microsecond
	cc := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 10})
	for _, c := range []struct {
		r         *Rule
		pct, want int64
	}{
		{tb, 0, 0}, {tb, -5, 0}, {tb, 25, 15_000_000}, {tb, 99, 59_400_000}, {tb, 150, 59_400_000},
		{fw, 1, 1}, {fw, 25, 3}, {fw, 30, 3}, {fw, 99, 10},
		{odd, 1, 1}, {odd, 50, 11}, // capacity 21 ticks: 0.21 and 10.5, rounded up
		{cc, 50, 0},
	} {
		if got := c.r.reserveUnits(c.pct); got != c.want {
			t.Errorf("%s: reserveUnits(%d) = %d, want %d", c.r.name, c.pct, got, c.want)
		}
	}
	ms := newMemory(t, newTestClock(epoch))
	n := 0
	for {
		if ok, _ := decide(t, ms, Request{Rule: fw, Key: "k", Cost: 1, Reserve: 25}); !ok {
			break
		}
		n++
	}
	if n != 7 {
		t.Fatalf("a window of 10 admitted %d requests with a reserve of 25%%, want 7 (2.5 rounded up to 3 left)", n)
	}
}

// TestDryRun: 30 requests at once on a dry-run zone of 10 a minute are all
// admitted, the last 20 marked DryRun (with what an enforced zone would
// have answered), and the zone is charged only the 10 it admits; an
// enforced zone of the same request is charged all 30, and when an
// enforced zone denies, the dry-run zone is charged nothing.
func TestDryRun(t *testing.T) {
	t.Parallel()
	eachStore(t, windowStart(epoch, time.Minute), func(t *testing.T, s *policyStore) {
		dry := mustConfig(t, RuleConfig{Name: "dry", Rate: 10, Per: time.Minute, DryRun: true})
		enforced := mustConfig(t, RuleConfig{Name: "enforced", Rate: 100, Per: time.Minute})
		dryRun := 0
		for i := range 30 {
			ok, res := decide(t, s, Request{Rule: dry, Key: "k", Cost: 1}, Request{Rule: enforced, Key: "k", Cost: 1})
			d, e := public(res[0]), public(res[1])
			if !ok || !d.Allowed || !e.Allowed || e.Remaining != int64(99-i) || e.DryRun {
				t.Fatalf("request %d: %v, dry-run zone %+v, enforced zone %+v", i, ok, d, e)
			}
			switch {
			case i < 10 && (d.DryRun || d.Remaining != int64(9-i)):
				t.Fatalf("request %d: the dry-run zone admits it: %+v", i, d)
			case i >= 10 && (!d.DryRun || d.Remaining != 0 || d.RetryAfter != 6*time.Second || d.Banned):
				t.Fatalf("request %d: the dry-run zone would deny it (a token in 6s): %+v", i, d)
			}
			if d.DryRun {
				dryRun++
			}
		}
		if dryRun != 20 {
			t.Fatalf("%d results DryRun, want 20", dryRun)
		}
		// Charged 10, not 30: one token later, one request passes
		// unmarked, and the next is a dry-run denial again.
		s.clk.add(6_000_000)
		if _, res := decide(t, s, Request{Rule: dry, Key: "k", Cost: 1}); res[0].DryRun || res[0].Remaining != 0 {
			t.Fatalf("a token later: %+v, want admitted without DryRun", public(res[0]))
		}
		if _, res := decide(t, s, Request{Rule: dry, Key: "k", Cost: 1}); !res[0].DryRun || !res[0].Allowed {
			t.Fatalf("then: %+v, want a dry-run denial", public(res[0]))
		}

		// What the windows and the log count: the 10 admitted only.
		for _, cfg := range []RuleConfig{
			{Name: "dryfw", Algorithm: FixedWindow, Rate: 10, Per: time.Minute, DryRun: true},
			{Name: "drylog", Algorithm: SlidingLog, Rate: 10, Per: time.Minute, DryRun: true},
		} {
			r := mustConfig(t, cfg)
			for range 30 {
				if ok, res := decide(t, s, Request{Rule: r, Key: "k", Cost: 1}); !ok || !res[0].Allowed {
					t.Fatalf("%s: a dry-run zone denied: %+v", r.name, public(res[0]))
				}
			}
			if n := s.stored(t, r, "k"); n != 10 {
				t.Fatalf("%s: the store counts %d requests after 30, want the 10 admitted", r.name, n)
			}
		}

		// An enforced zone that denies: the dry-run zone, which would
		// admit, is charged nothing.
		dryfw := mustConfig(t, RuleConfig{Name: "dryfw2", Algorithm: FixedWindow, Rate: 10, Per: time.Minute, DryRun: true})
		strict := mustConfig(t, RuleConfig{Name: "strict", Rate: 1, Per: time.Hour})
		if ok, _ := decide(t, s, Request{Rule: dryfw, Key: "k", Cost: 1}, Request{Rule: strict, Key: "k", Cost: 1}); !ok {
			t.Fatal("the first request was denied")
		}
		ok, res := decide(t, s, Request{Rule: dryfw, Key: "k", Cost: 1}, Request{Rule: strict, Key: "k", Cost: 1})
		if ok || !res[0].Allowed || res[0].DryRun || res[0].Remaining != 9 || res[1].Allowed {
			t.Fatalf("enforced zone denies: %v %+v", ok, res)
		}
		if n := s.stored(t, dryfw, "k"); n != 1 {
			t.Fatalf("the dry-run zone counts %d after a denied request, want 1", n)
		}
	})
}

// banRule is a zone of 5 tokens an hour (one every 12 minutes) that bans a
// key for 30 minutes after 5 denials within a minute.
func banRule(t testing.TB, name string, dryRun bool) *Rule {
	return mustConfig(t, RuleConfig{Name: name, Rate: 5, Per: time.Hour, DryRun: dryRun,
		Ban: Ban{Duration: 30 * time.Minute, After: 5, Window: time.Minute}})
}

// TestBans: the fifth denial within the window bans the key for the ban's
// duration (Banned, BanStarted, Retry-After the duration), later requests
// are Banned with the rest of the ban as Retry-After and charge nothing,
// the ban ends exactly on time; four denials and a fifth a window later
// ban nothing, a fifth just inside the window does; a dry run reports the
// ban it would start and keeps none.
func TestBans(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		r := banRule(t, "ban", false)
		t0 := s.clk.now()
		checkBanStartsAndEnds(t, s, r, t0)
		checkBanWindow(t, s, r, t0)
		checkDryRunBan(t, s, t0)
	})
}

// Steps of TestBans' clock: a second and a minute, in microseconds.
const banTestSecond, banTestMinute = 1_000_000, 60_000_000

// checkBanStartsAndEnds: the fifth denial, a second apart, starts the
// ban; requests during it are Banned with the rest of the ban and charge
// nothing; it ends exactly on time.
func checkBanStartsAndEnds(t *testing.T, s *policyStore, r *Rule, t0 int64) {
	const s1, minute = banTestSecond, banTestMinute
	q := Request{Rule: r, Key: "k", Cost: 1}
	for i := range 5 {
		if ok, res := decide(t, s, q); !ok {
			t.Fatalf("request %d of a full bucket denied: %+v", i, public(res[0]))
		}
	}
	for i := int64(1); i <= 4; i++ {
		s.clk.set(t0 + i*s1)
		_, res := decide(t, s, q)
		want := Result{RetryAfter: 12*time.Minute - time.Duration(i)*time.Second, ResetAfter: time.Hour - time.Duration(i)*time.Second}
		if public(res[0]) != want {
			t.Fatalf("denial %d: %+v, want %+v", i, public(res[0]), want)
		}
	}
	s.clk.set(t0 + 5*s1)
	if _, res := decide(t, s, q); public(res[0]) != (Result{Banned: true, BanStarted: true, RetryAfter: 30 * time.Minute, ResetAfter: 30 * time.Minute}) {
		t.Fatalf("the fifth denial: %+v, want the ban started, Retry-After 30m", public(res[0]))
	}
	banEnd := t0 + 5*s1 + 30*minute
	for _, at := range []int64{t0 + 6*s1, t0 + 25*minute, t0 + 25*minute, t0 + 25*minute, banEnd - 1} {
		s.clk.set(at)
		ok, res := decide(t, s, q)
		if want := (Result{Banned: true, RetryAfter: us(banEnd - at), ResetAfter: us(banEnd - at)}); ok || public(res[0]) != want {
			t.Fatalf("at +%dus: %v %+v, want %+v", at-t0, ok, public(res[0]), want)
		}
	}
	// 30m5s after the bucket emptied, it holds 2 tokens: the
	// requests during the ban charged nothing.
	s.clk.set(banEnd)
	for i := range 2 {
		if ok, res := decide(t, s, q); !ok || res[0].Banned {
			t.Fatalf("request %d at the ban's end: %+v, want admitted", i, public(res[0]))
		}
	}
	if ok, res := decide(t, s, q); ok || res[0].Banned {
		t.Fatalf("a denial after the ban: %+v, want denied, not banned (the count starts again)", public(res[0]))
	}
}

// checkBanWindow: four denials, then a fifth when the first one's window
// has ended: no ban; a fifth just inside it: a ban.
func checkBanWindow(t *testing.T, s *policyStore, r *Rule, t0 int64) {
	const s1, minute = banTestSecond, banTestMinute
	for _, c := range []struct {
		key   string
		fifth int64
		ban   bool
	}{{"late", t0 + 1*s1 + minute, false}, {"inside", t0 + 1*s1 + minute - 1, true}} {
		s.clk.set(t0)
		q := Request{Rule: r, Key: c.key, Cost: 5}
		decide(t, s, q)
		for i := int64(1); i <= 4; i++ {
			s.clk.set(t0 + i*s1)
			decide(t, s, q)
		}
		s.clk.set(c.fifth)
		if _, res := decide(t, s, q); res[0].BanStarted != c.ban || res[0].Banned != c.ban {
			t.Fatalf("%s: the fifth denial at +%dus: %+v, want ban %v", c.key, c.fifth-t0, public(res[0]), c.ban)
		}
	}
}

// checkDryRunBan: a dry run reports the ban it would start, and keeps
// none.
func checkDryRunBan(t *testing.T, s *policyStore, t0 int64) {
	dry := banRule(t, "dryban", true)
	s.clk.set(t0)
	qd := Request{Rule: dry, Key: "k", Cost: 1}
	for i := range 9 {
		if ok, res := decide(t, s, qd); !ok || res[0].Banned || res[0].BanStarted || res[0].DryRun != (i >= 5) {
			t.Fatalf("dry run, request %d: %v %+v", i, ok, public(res[0]))
		}
	}
	ok, res := decide(t, s, qd)
	if !ok || !res[0].Allowed || !res[0].DryRun || !res[0].BanStarted || res[0].Banned || res[0].RetryAfter != 12*time.Minute {
		t.Fatalf("dry run, the fifth denial: %v %+v, want Allowed, DryRun, BanStarted, Retry-After 12m", ok, public(res[0]))
	}
	s.clk.add(banTestSecond)
	ok, res = decide(t, s, qd)
	if !ok || !res[0].DryRun || res[0].Banned || res[0].BanStarted || res[0].RetryAfter != 12*time.Minute-time.Second {
		t.Fatalf("dry run after its ban started: %v %+v, want a dry-run denial, not banned", ok, public(res[0]))
	}
}

// TestBanDenyCache: a ban zone's denials reach the store (each counts
// towards the ban, so the deny cache does not hold the zone's buckets);
// once the ban starts, the deny cache answers the key's requests with the
// rest of the ban and no store call until the ban ends; Forget drops the
// cached ban, so the next request asks the store again.
func TestBanDenyCache(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		inner := &countingStore{Store: s.Store}
		cache := NewDenyCache(DenyCacheOptions{Clock: s.clk})
		l := New(inner, Options{Cache: cache})
		r := banRule(t, "ban", false)
		t0 := s.clk.now()
		res := make([]Result, 1)
		decideAt := func(at int64) Outcome {
			s.clk.set(at)
			return l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
		}
		for i := range 9 {
			want := Allowed
			if i >= 5 {
				want = Denied
			}
			if got := decideAt(t0 + int64(i)); got != want || res[0].Banned {
				t.Fatalf("request %d: %v %+v, want %v", i, got, public(res[0]), want)
			}
		}
		if got := decideAt(t0 + 9); got != Denied || !res[0].BanStarted {
			t.Fatalf("the fifth denial: %v %+v, want the ban started", got, public(res[0]))
		}
		if n := inner.calls.Load(); n != 10 {
			t.Fatalf("%d store calls for 10 requests: every denial of a ban zone must reach the store", n)
		}
		banEnd := t0 + 9 + 30*60_000_000
		for i := range 100 {
			at := t0 + 1_000_000 + int64(i)*10_000_000
			if got := decideAt(at); got != Denied || public(res[0]) != (Result{Banned: true, RetryAfter: us(banEnd - at), ResetAfter: us(banEnd - at)}) {
				t.Fatalf("banned request %d: %v %+v", i, got, public(res[0]))
			}
		}
		if n, hits := inner.calls.Load(), cache.Hits(); n != 10 || hits != 100 {
			t.Fatalf("during the ban: %d store calls (want 10), %d cache hits (want 100)", n, hits)
		}
		// An operator lifts the ban: the cache forgets it, the next
		// request asks the store (which, here, still bans).
		cache.Forget(r.Bucket(), "k")
		if got := decideAt(t0 + 20*60_000_000); got != Denied || !res[0].Banned || inner.calls.Load() != 11 {
			t.Fatalf("after Forget: %v %+v, %d store calls; want the store asked (11)", got, public(res[0]), inner.calls.Load())
		}
		if got := decideAt(banEnd - 1); got != Denied || res[0].RetryAfter != time.Microsecond || inner.calls.Load() != 11 {
			t.Fatalf("the end of the ban: %v %+v, %d store calls; want the cache's answer", got, public(res[0]), inner.calls.Load())
		}
		if got := decideAt(banEnd); got != Allowed || inner.calls.Load() != 12 {
			t.Fatalf("after the ban: %v %+v, %d store calls; want admitted by the store", got, public(res[0]), inner.calls.Load())
		}
	})
}

// TestConcurrency: at most the limit in flight, each request with a slot
// id of its own; a refund frees its slots; a cost above the limit never
// passes; a cost of 0 only looks; a request of 2 slots holds and frees 2.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		r := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 3})
		if r.Lease() != DefaultLease {
			t.Fatalf("lease %s, want the default %s", r.Lease(), DefaultLease)
		}
		l := New(s.Store, Options{})
		type held struct {
			reqs []Request
			res  []Result
		}
		var flight []held
		slots := map[string]bool{}
		one := func(key string, cost int64) (Outcome, held) {
			h := held{reqs: []Request{{Rule: r, Key: key, Cost: cost}}, res: make([]Result, 1)}
			return l.Decide(context.Background(), h.reqs, h.res), h
		}
		for i := range 3 {
			out, h := one("k", 1)
			if out != Allowed || h.res[0].Remaining != int64(2-i) || h.reqs[0].Slot == "" || slots[h.reqs[0].Slot] {
				t.Fatalf("request %d: %v %+v, slot %q", i, out, public(h.res[0]), h.reqs[0].Slot)
			}
			slots[h.reqs[0].Slot] = true
			flight = append(flight, h)
		}
		if n := s.stored(t, r, "k"); n != 3 {
			t.Fatalf("the store holds %d slots, want 3", n)
		}
		if out, h := one("k", 1); out != Denied || public(h.res[0]) != (Result{RetryAfter: slotRetry}) {
			t.Fatalf("a fourth request: %v %+v", out, public(h.res[0]))
		}
		if out, h := one("k", 0); out != Allowed || h.res[0].Remaining != 0 {
			t.Fatalf("a look (cost 0): %v %+v", out, public(h.res[0]))
		}
		if out, h := one("k", 4); out != Denied || h.res[0].RetryAfter != Never {
			t.Fatalf("a cost above the limit: %v %+v, want Never", out, public(h.res[0]))
		}
		if err := l.Refund(context.Background(), Allowed, flight[0].reqs, flight[0].res); err != nil {
			t.Fatalf("refund: %v", err)
		}
		if out, h := one("k", 1); out != Allowed || h.res[0].Remaining != 0 {
			t.Fatalf("after a refund: %v %+v, want admitted", out, public(h.res[0]))
		}
		if asked, lost := l.Refunds(); asked != 1 || lost != 0 {
			t.Fatalf("Refunds() = %d, %d; want 1, 0", asked, lost)
		}

		// Two slots at once.
		out, two := one("m", 2)
		if out != Allowed || two.res[0].Remaining != 1 {
			t.Fatalf("cost 2: %v %+v", out, public(two.res[0]))
		}
		if out, h := one("m", 1); out != Allowed || h.res[0].Remaining != 0 {
			t.Fatalf("cost 1 beside cost 2: %v %+v", out, public(h.res[0]))
		}
		if out, _ := one("m", 1); out != Denied {
			t.Fatalf("a fourth slot: %v", out)
		}
		if err := l.Refund(context.Background(), Allowed, two.reqs, two.res); err != nil {
			t.Fatalf("refund: %v", err)
		}
		if n := s.stored(t, r, "m"); n != 1 {
			t.Fatalf("after refunding 2 of 3 slots the store holds %d, want 1", n)
		}
		if out, h := one("m", 2); out != Allowed || h.res[0].Remaining != 0 {
			t.Fatalf("cost 2 after the refund: %v %+v", out, public(h.res[0]))
		}
	})
}

// TestRefundTokenBucket: a refund gives the charge back to the bucket,
// and never makes it fuller than full.
func TestRefundTokenBucket(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		r := mustConfig(t, RuleConfig{Name: "tb", Rate: 3, Per: time.Second, Burst: 3, Refunds: true})
		q := []Request{{Rule: r, Key: "k", Cost: 1}}
		charged := decideTimes(t, s, 3, q...)
		if ok, _ := decide(t, s, q...); ok {
			t.Fatal("an empty bucket admitted")
		}
		refund(t, s, q, charged[0])
		if ok, res := decide(t, s, q...); !ok || res[0].Remaining != 0 {
			t.Fatalf("after a refund: %v %+v, want one more admitted", ok, public(res[0]))
		}
		s.clk.add(5_000_000) // full again
		refund(t, s, q, charged[1])
		if ok, res := decide(t, s, q...); !ok || res[0].Remaining != 2 {
			t.Fatalf("a refund to a full bucket: %v %+v, want Remaining 2 (never beyond full)", ok, public(res[0]))
		}
	})
}

// TestRefundFixedWindow: a refund frees the charge in its window, and does
// nothing once the window has turned.
func TestRefundFixedWindow(t *testing.T) {
	t.Parallel()
	w := 10 * time.Second
	eachStore(t, windowStart(epoch, w)+1_000_000, func(t *testing.T, s *policyStore) {
		r := mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 3, Per: w, Refunds: true})
		q := []Request{{Rule: r, Key: "k", Cost: 1}}
		charged := decideTimes(t, s, 3, q...)
		if ok, _ := decide(t, s, q...); ok {
			t.Fatal("a full window admitted")
		}
		refund(t, s, q, charged[0])
		if s.ms != nil {
			// Like the commit (and Redis' TTL), the refund keeps the
			// bucket until its window ends.
			id := s.ms.hash.id(r.bucket, "k")
			s.ms.shards[id.shard()].mu.Lock()
			e, _ := s.ms.shards[id.shard()].m.get(id)
			s.ms.shards[id.shard()].mu.Unlock()
			if end := windowStart(s.clk.now(), w) + int64(w/time.Microsecond); e.expires != end {
				t.Fatalf("after a refund the bucket expires at +%dus, want its window's end +%dus", e.expires-s.clk.now(), end-s.clk.now())
			}
		}
		if ok, res := decide(t, s, q...); !ok || res[0].Remaining != 0 {
			t.Fatalf("after a refund in the window: %v %+v", ok, public(res[0]))
		}
		s.clk.add(int64(w / time.Microsecond)) // the next window
		for range 3 {
			decide(t, s, q...)
		}
		refund(t, s, q, charged[1]) // charged in the previous window
		if n := s.stored(t, r, "k"); n != 3 {
			t.Fatalf("a refund of the previous window's charge: the window counts %d, want 3", n)
		}
		if ok, _ := decide(t, s, q...); ok {
			t.Fatal("a refund of the previous window's charge freed room in this one")
		}
	})
}

// TestRefundSlidingWindow: a refund takes the charge off the window that
// counted it: the current one, or the previous one (whose weight the
// estimate still carries) after the window turned; a charge two windows
// old is not refunded.
func TestRefundSlidingWindow(t *testing.T) {
	t.Parallel()
	w := 10 * time.Second
	start := windowStart(epoch, w)
	eachStore(t, start+5_000_000, func(t *testing.T, s *policyStore) {
		r := mustConfig(t, RuleConfig{Name: "sw", Algorithm: SlidingWindow, Rate: 4, Per: w, Refunds: true})
		q := []Request{{Rule: r, Key: "k", Cost: 1}}
		charged := decideTimes(t, s, 4, q...)
		refund(t, s, q, charged[0])
		if ok, _ := decide(t, s, q...); !ok {
			t.Fatal("after a refund in the window: denied")
		}
		s.clk.set(start + 10_000_000) // the next window: the previous one weighs fully
		if ok, _ := decide(t, s, q...); ok {
			t.Fatal("4 in the previous window, weighing fully: admitted")
		}
		refund(t, s, q, charged[1])
		if ok, _ := decide(t, s, q...); !ok {
			t.Fatal("after a refund of the previous window's charge: denied")
		}
		s.clk.set(start + 20_000_000) // previous: 1, current: 0
		refund(t, s, q, charged[2])   // two windows old: nothing
		if ok, res := decide(t, s, Request{Rule: r, Key: "k", Cost: 3}); !ok || res[0].Remaining != 0 {
			t.Fatalf("cost 3 beside the previous window's 1: %v %+v", ok, public(res[0]))
		}
		if ok, _ := decide(t, s, q...); ok {
			t.Fatal("a refund of a charge two windows old freed room")
		}
	})
}

// TestRefundSlidingLog: a refund removes the very entry of its charge, at
// its time and of its cost, and the retry time follows the entries left.
func TestRefundSlidingLog(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		r := mustConfig(t, RuleConfig{Name: "log", Algorithm: SlidingLog, Rate: 3, Per: 10 * time.Second, Refunds: true})
		t0 := s.clk.now()
		one := Request{Rule: r, Key: "k", Cost: 1}
		two := Request{Rule: r, Key: "k", Cost: 2}
		_, c1 := decide(t, s, one)
		s.clk.add(1_000_000)
		_, c2 := decide(t, s, two)
		if ok, _ := decide(t, s, one); ok {
			t.Fatal("a full log admitted")
		}
		s.clk.add(1_000_000)
		refund(t, s, []Request{one}, c1) // the entry at t0
		if ok, _ := decide(t, s, one); !ok {
			t.Fatal("after the refund of the entry at t0: denied")
		}
		// Left: t0+1s (cost 2) and t0+2s (cost 1). A request at t0+3s
		// fits when t0+1s leaves, at t0+11s.
		s.clk.set(t0 + 3_000_000)
		if _, res := decide(t, s, one); res[0].Allowed || res[0].RetryAfter != 8*time.Second {
			t.Fatalf("the log after the refund: %+v, want Retry-After 8s", public(res[0]))
		}
		_ = c2

		// Two entries at the same microsecond, of costs 1 and 2: the
		// refund of the cost-1 charge removes that one.
		s.clk.set(t0 + 60_000_000)
		_, a := decide(t, s, Request{Rule: r, Key: "same", Cost: 1})
		decide(t, s, Request{Rule: r, Key: "same", Cost: 2})
		refund(t, s, []Request{{Rule: r, Key: "same", Cost: 1}}, a)
		if _, res := decide(t, s, Request{Rule: r, Key: "same", Cost: 0}); res[0].Remaining != 1 {
			t.Fatalf("after refunding the cost-1 entry beside a cost-2 one: %+v, want Remaining 1", public(res[0]))
		}
		if n := s.stored(t, r, "same"); n != 1 {
			t.Fatalf("the log holds %d entries, want 1", n)
		}
	})
}

// TestRefundDryRunChargesNothing: a dry-run zone that would have denied
// was not charged, so its refund (a slot, a response not counted) gives
// nothing back: not another request's slot, not tokens never taken.
func TestRefundDryRunChargesNothing(t *testing.T) {
	t.Parallel()
	eachStore(t, epoch, func(t *testing.T, s *policyStore) {
		for _, r := range []*Rule{
			mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 1, DryRun: true}),
			mustConfig(t, RuleConfig{Name: "tb", Rate: 1, Per: time.Hour, DryRun: true, Refunds: true}),
		} {
			q := []Request{{Rule: r, Key: "k", Cost: 1, Slot: "a"}}
			if _, res := decide(t, s, q...); res[0].DryRun {
				t.Fatalf("%s: the first request: %+v", r.name, public(res[0]))
			}
			q[0].Slot = "b"
			_, b := decide(t, s, q...)
			if !b[0].DryRun {
				t.Fatalf("%s: the second request: %+v, want a dry-run denial", r.name, public(b[0]))
			}
			refund(t, s, q, b)
			q[0].Slot = "c"
			if _, res := decide(t, s, q...); !res[0].DryRun {
				t.Fatalf("%s: after refunding a dry-run denial: %+v, want a dry-run denial still", r.name, public(res[0]))
			}
		}
	})
}

// TestRefundLocalFallback: a decision made on the local fallback buckets
// is refunded there; a refund the store fails is dropped and counted.
func TestRefundLocalFallback(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	l := New(failingStore{}, Options{Local: newMemory(t, clk)})
	tb := mustConfig(t, RuleConfig{Name: "tb", Rate: 2, Per: time.Minute, FleetSize: 1})
	cc := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 1, FleetSize: 1})
	for _, r := range []*Rule{tb, cc} {
		var first []Result
		for i := range 3 {
			res := make([]Result, 1)
			out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
			if want := map[bool]Outcome{true: LocalAllowed, false: LocalDenied}[i < int(r.local.burst)]; out != want {
				t.Fatalf("%s request %d: %v, want %v", r.name, i, out, want)
			}
			if i == 0 {
				first = res
			}
		}
		if err := l.Refund(context.Background(), LocalAllowed, []Request{{Rule: r, Key: "k", Cost: 1}}, first); err != nil {
			t.Fatalf("%s: local refund: %v", r.name, err)
		}
		res := make([]Result, 1)
		if out := l.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != LocalAllowed {
			t.Fatalf("%s: after the local refund: %v %+v, want LocalAllowed", r.name, out, public(res[0]))
		}
	}
	if asked, lost := l.Refunds(); asked != 2 || lost != 0 {
		t.Fatalf("Refunds() = %d, %d; want 2, 0", asked, lost)
	}
	if err := l.Refund(context.Background(), Allowed, []Request{{Rule: tb, Key: "k", Cost: 1}}, make([]Result, 1)); err == nil {
		t.Fatal("a refund the store failed returned no error")
	}
	if asked, lost := l.Refunds(); asked != 3 || lost != 1 {
		t.Fatalf("Refunds() = %d, %d; want 3, 1", asked, lost)
	}
}

// TestLocalFallbackKeepsPolicies: on the local fallback buckets a request
// keeps its reserve, a dry-run zone still denies nothing (under on_error
// deny it does not fail closed either), and a concurrency zone's limit is
// divided among the fleet like a window's count.
func TestLocalFallbackKeepsPolicies(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	l := New(failingStore{}, Options{Local: newMemory(t, clk)})
	ctx := context.Background()
	res := make([]Result, 1)
	admitted := func(q Request) int {
		n := 0
		for range 20 {
			if l.Decide(ctx, []Request{q}, res) != LocalAllowed {
				break
			}
			n++
		}
		return n
	}
	tb := mustConfig(t, RuleConfig{Name: "tb", Rate: 10, Per: time.Minute, FleetSize: 1})
	if n := admitted(Request{Rule: tb, Key: "k", Cost: 1, Reserve: 30}); n != 7 {
		t.Fatalf("a local bucket of 10 admitted %d requests with a reserve of 30%%, want 7", n)
	}
	if n := admitted(Request{Rule: tb, Key: "k", Cost: 1}); n != 3 {
		t.Fatalf("then %d without a reserve, want the 3 left", n)
	}

	dry := mustConfig(t, RuleConfig{Name: "dry", Rate: 2, Per: time.Minute, DryRun: true, FleetSize: 1})
	for i := range 5 {
		out := l.Decide(ctx, []Request{{Rule: dry, Key: "k", Cost: 1}}, res)
		if out != LocalAllowed || !res[0].Allowed || res[0].DryRun != (i >= 2) {
			t.Fatalf("dry run on the local bucket, request %d: %v %+v", i, out, public(res[0]))
		}
	}
	dryDeny := mustConfig(t, RuleConfig{Name: "drydeny", Rate: 2, Per: time.Minute, DryRun: true, OnError: PolicyDeny})
	if out := l.Decide(ctx, []Request{{Rule: dryDeny, Key: "k", Cost: 1}}, res); out != FailedOpen || !res[0].Allowed {
		t.Fatalf("a dry run with on_error deny, the store down: %v %+v, want FailedOpen", out, public(res[0]))
	}

	cc := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 4, Lease: time.Hour, FleetSize: 2})
	if cc.local.rate != 2 || cc.local.Lease() != time.Hour {
		t.Fatalf("the local rule of 4 slots over 2 nodes: %d slots, lease %s; want 2, 1h", cc.local.rate, cc.local.Lease())
	}
	if n := admitted(Request{Rule: cc, Key: "k", Cost: 1}); n != 2 {
		t.Fatalf("a local concurrency zone of 4 over 2 nodes admitted %d, want 2", n)
	}
}

// TestMemoryMaxKeysConcurrencySlots: a store bounded to one bucket per
// shard makes room for new keys of a concurrency zone, whose slots are held
// until refunded and so never full: it evicts them (and counts it) rather
// than looking forever for a bucket closer to full.
func TestMemoryMaxKeysConcurrencySlots(t *testing.T) {
	t.Parallel()
	s := newMemory(t, newTestClock(epoch))
	s.SetMaxKeys(numShards)
	r := mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 2})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var res [1]Result
		for i := range 1000 {
			if ok, _ := s.Decide(context.Background(), []Request{{Rule: r, Key: "k" + itoa(int64(i)), Cost: 1}}, res[:]); !ok {
				t.Errorf("new key %d denied", i)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("1000 decisions did not end within a minute: the store looks for room forever")
	}
	if n := s.Len(); n > s.MaxKeys() {
		t.Fatalf("the store holds %d buckets, bound %d", n, s.MaxKeys())
	}
	if s.Evictions(r.Bucket()) == 0 {
		t.Fatal("no eviction counted")
	}
}

// itoa formats n in decimal.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
