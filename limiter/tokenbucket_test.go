package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// epoch is a realistic Unix time in microseconds: the traces start near it
// so that stored states have the size they have in production.
const epoch int64 = 1_700_000_000_000_000

// testClock is a controlled clock in microseconds, safe for concurrent use.
type testClock struct{ us atomic.Int64 }

func newTestClock(start int64) *testClock {
	c := &testClock{}
	c.us.Store(start)
	return c
}

func (c *testClock) now() int64   { return c.us.Load() }
func (c *testClock) set(us int64) { c.us.Store(us) }
func (c *testClock) add(d int64)  { c.us.Add(d) }

// Now implements Clock: the clock's microsecond as a time.
func (c *testClock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

func mustRule(t testing.TB, name string, rate int64, per time.Duration, burst int64) *Rule {
	t.Helper()
	return mustConfig(t, RuleConfig{Name: name, Rate: rate, Per: per, Burst: burst})
}

func mustConfig(t testing.TB, cfg RuleConfig) *Rule {
	t.Helper()
	r, err := NewRule(cfg)
	if err != nil {
		t.Fatalf("NewRule(%+v): %v", cfg, err)
	}
	return r
}

// newMemory returns a MemoryStore on clock c whose sweeper never fires
// during a test (tests call Sweep themselves), closed when the test ends.
func newMemory(t testing.TB, c *testClock) *MemoryStore {
	t.Helper()
	s := NewMemoryStore(MemoryOptions{Sweep: time.Hour, Clock: c})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// public returns a result without its unexported bookkeeping, to compare
// with results built by hand.
func public(r Result) Result {
	r.owed, r.at = 0, 0
	return r
}

// decideOne decides a single-zone request and fails the test on error.
func decideOne(t testing.TB, s Store, r *Rule, key string, cost int64) (bool, Result) {
	t.Helper()
	reqs := [1]Request{{Rule: r, Key: key, Cost: cost}}
	var res [1]Result
	ok, err := s.Decide(context.Background(), reqs[:], res[:])
	if err != nil {
		t.Fatalf("Decide(%s, %q, cost %d): %v", r.name, key, cost, err)
	}
	if ok != res[0].Allowed {
		t.Fatalf("Decide(%s, %q, cost %d) = %v, but the only zone says Allowed=%v", r.name, key, cost, ok, res[0].Allowed)
	}
	return ok, res[0]
}

func TestNewRuleErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		rate  int64
		per   time.Duration
		burst int64
		want  error
	}{
		{"zero rate", 0, time.Second, 1, ErrBadRate},
		{"negative rate", -3, time.Second, 1, ErrBadRate},
		{"zero period", 3, 0, 1, ErrBadPer},
		{"negative period", 3, -time.Second, 1, ErrBadPer},
		{"period below a microsecond", 3, 999 * time.Nanosecond, 1, ErrBadPer},
		{"negative burst", 3, time.Second, -1, ErrBadBurst},
		{"burst x interval too large", 1, 1000 * time.Hour, 1 << 20, ErrTooLarge},
		{"default burst x interval too large", 1 << 40, 1 << 62, 0, ErrTooLarge},
		{"inexact period too long", 1009, time.Duration(math.MaxInt64), 1, ErrTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := NewRule(RuleConfig{Name: "z", Rate: tc.rate, Per: tc.per, Burst: tc.burst})
			if !errors.Is(err, tc.want) {
				t.Fatalf("NewRule(%d, %s, %d) = %v, %v; want error %v", tc.rate, tc.per, tc.burst, r, err, tc.want)
			}
			if r != nil {
				t.Fatalf("NewRule returned a rule with its error: %+v", r)
			}
		})
	}
}

func TestNewRuleCompiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rate     int64
		per      time.Duration
		burst    int64
		wantB    int64
		denom    int64
		interval int64
		exact    bool
		window   int64
	}{
		// 3 per second: a tick is a third of a microsecond, a token 1e6 ticks.
		{3, time.Second, 0, 3, 3, 1_000_000, true, 1},
		{3, time.Second, 10, 10, 3, 1_000_000, true, 1},
		{7, time.Second, 1, 1, 7, 1_000_000, true, 1},
		// 100 per minute: one token every 600 ms, whole microseconds.
		{100, time.Minute, 0, 100, 1, 600_000, true, 60},
		{100, time.Minute, 5, 5, 1, 600_000, true, 60},
		// 999 per minute: gcd(999, 6e7) = 3, so 333 ticks a microsecond.
		{999, time.Minute, 0, 999, 333, 20_000_000, true, 60},
		// 12345 per second reduces to 2469/200000: above 1000, so the
		// interval is ceil(1e9/12345) thousandths of a microsecond.
		{12345, time.Second, 0, 12345, 1000, 81_005, false, 1},
		{1, time.Microsecond, 0, 1, 1, 1, true, 1},
		{1000, time.Microsecond, 0, 1000, 1000, 1, true, 1},
		{1001, time.Microsecond, 1, 1, 1000, 1, false, 1},
		{10, 1500 * time.Millisecond, 0, 10, 1, 150_000, true, 2},
		{7, 1500 * time.Millisecond, 0, 7, 7, 1_500_000, true, 2},
		{1, 24 * time.Hour, 0, 1, 1, 86_400_000_000, true, 86400},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d per %s burst %d", tc.rate, tc.per, tc.burst), func(t *testing.T) {
			t.Parallel()
			r := mustRule(t, "z", tc.rate, tc.per, tc.burst)
			if r.name != "z" || r.rate != tc.rate || r.per != tc.per || r.burst != tc.wantB {
				t.Errorf("rule = %+v, want rate %d per %s burst %d", r, tc.rate, tc.per, tc.wantB)
			}
			if r.denom != tc.denom || r.interval != tc.interval || r.exact != tc.exact {
				t.Errorf("Denom, Interval, Exact = %d, %d, %v; want %d, %d, %v", r.denom, r.interval, r.exact, tc.denom, tc.interval, tc.exact)
			}
			if r.capacity != tc.wantB*tc.interval {
				t.Errorf("Capacity = %d, want %d", r.capacity, tc.wantB*tc.interval)
			}
			if w := r.Window(); w != tc.window {
				t.Errorf("Window() = %d, want %d", w, tc.window)
			}
			// One token is Interval ticks of 1/Denom us; Rate tokens
			// take Per: exactly, or (inexact rules) at most one tick
			// more per token.
			perUS := new(big.Int).SetInt64(int64(tc.per / time.Microsecond))
			lhs := new(big.Int).Mul(big.NewInt(r.interval), big.NewInt(tc.rate))
			rhs := new(big.Int).Mul(perUS, big.NewInt(r.denom))
			if tc.exact {
				if lhs.Cmp(rhs) != 0 {
					t.Errorf("Interval x Rate = %s, want Per x Denom = %s", lhs, rhs)
				}
			} else {
				below := new(big.Int).Mul(big.NewInt(r.interval-1), big.NewInt(tc.rate))
				if lhs.Cmp(rhs) < 0 || below.Cmp(rhs) >= 0 {
					t.Errorf("Interval %d is not the least whole number of ticks >= Per x Denom / Rate", r.interval)
				}
			}
		})
	}
}

func TestRuleString(t *testing.T) {
	t.Parallel()
	r := mustRule(t, "api", 3, time.Second, 0)
	if got, want := r.String(), "api: 3 per 1s, burst 3"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestFreshBucketAdmitsBurstAtOneInstant(t *testing.T) {
	t.Parallel()
	for _, r := range []*Rule{
		mustRule(t, "a", 3, time.Second, 0),
		mustRule(t, "b", 7, time.Second, 1),
		mustRule(t, "c", 100, time.Minute, 5),
		mustRule(t, "d", 12345, time.Second, 0),
		mustRule(t, "e", 1, time.Hour, 50),
	} {
		t.Run(r.String(), func(t *testing.T) {
			t.Parallel()
			clk := newTestClock(epoch)
			s := newMemory(t, clk)
			for i := int64(1); i <= r.burst; i++ {
				ok, res := decideOne(t, s, r, "k", 1)
				if !ok || res.Remaining != r.burst-i {
					t.Fatalf("request %d: allowed %v remaining %d; want allowed, remaining %d", i, ok, res.Remaining, r.burst-i)
				}
			}
			ok, res := decideOne(t, s, r, "k", 1)
			if ok || res.Remaining != 0 || res.RetryAfter <= 0 {
				t.Fatalf("request %d at the same instant: %+v; want a denial with nothing remaining", r.burst+1, res)
			}
		})
	}
}

func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	// The worked case: 3 per second, a token every 333333.33 us, so a
	// client denied at t must wait 333334 us, not a microsecond less.
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	r := mustRule(t, "z", 3, time.Second, 0)
	for range 3 {
		decideOne(t, s, r, "k", 1)
	}
	_, res := decideOne(t, s, r, "k", 1)
	if res.RetryAfter != 333_334*time.Microsecond || res.ResetAfter != time.Second {
		t.Fatalf("denied: %+v; want RetryAfter 333334us, ResetAfter 1s", res)
	}
	clk.add(333_333)
	if ok, _ := decideOne(t, s, r, "k", 1); ok {
		t.Fatal("admitted 1us before RetryAfter")
	}
	clk.add(1)
	if ok, _ := decideOne(t, s, r, "k", 1); !ok {
		t.Fatal("denied at RetryAfter")
	}

	// Random rules, states and costs: retrying 1us before RetryAfter is
	// denied, retrying at RetryAfter is admitted.
	rules := []*Rule{
		mustRule(t, "a", 3, time.Second, 0),
		mustRule(t, "b", 7, time.Second, 1),
		mustRule(t, "c", 100, time.Minute, 5),
		mustRule(t, "d", 999, time.Minute, 0),
		mustRule(t, "e", 12345, time.Second, 40),
		mustRule(t, "f", 1001, time.Microsecond, 3),
		mustRule(t, "g", 10, 1500*time.Millisecond, 4),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		r := rules[rng.IntN(len(rules))]
		key := fmt.Sprint("k", i)
		start := epoch + rng.Int64N(1e12)
		clk.set(start)
		// Spend at random times until a request is denied.
		var res Result
		var cost int64
		for {
			cost = 1 + rng.Int64N(r.burst)
			var ok bool
			ok, res = decideOne(t, s, r, key, cost)
			if !ok {
				break
			}
			clk.add(rng.Int64N(int64(r.per/time.Microsecond)/r.rate + 1))
		}
		if res.RetryAfter <= 0 {
			t.Fatalf("%s: denied cost %d with RetryAfter %s", r, cost, res.RetryAfter)
		}
		denied := clk.now()
		clk.set(denied + int64(res.RetryAfter/time.Microsecond) - 1)
		if ok, early := decideOne(t, s, r, key, cost); ok {
			t.Fatalf("%s: cost %d denied at %d with %+v, but admitted 1us before RetryAfter: %+v", r, cost, denied, res, early)
		}
		clk.set(denied + int64(res.RetryAfter/time.Microsecond))
		if ok, late := decideOne(t, s, r, key, cost); !ok {
			t.Fatalf("%s: cost %d denied at %d with %+v, and denied again at RetryAfter: %+v", r, cost, denied, res, late)
		}
	}
}

func TestResetAfterIsExact(t *testing.T) {
	t.Parallel()
	rules := []*Rule{
		mustRule(t, "a", 3, time.Second, 0),
		mustRule(t, "c", 100, time.Minute, 5),
		mustRule(t, "e", 12345, time.Second, 40),
	}
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 500 {
		r := rules[rng.IntN(len(rules))]
		key := fmt.Sprint("k", i)
		clk.set(epoch + rng.Int64N(1e12))
		var res Result
		for range 1 + rng.IntN(int(r.burst)) {
			if ok, got := decideOne(t, s, r, key, 1); ok {
				res = got
			}
			clk.add(rng.Int64N(int64(r.per/time.Microsecond)/r.rate/4 + 1))
		}
		at := clk.now()
		_, look := decideOne(t, s, r, key, 0)
		reset := int64(look.ResetAfter / time.Microsecond)
		if reset <= 0 {
			t.Fatalf("%s: ResetAfter %s after spending (last %+v)", r, look.ResetAfter, res)
		}
		clk.set(at + reset - 1)
		if _, got := decideOne(t, s, r, key, 0); got.Remaining != r.burst-1 || got.ResetAfter != time.Microsecond {
			t.Fatalf("%s: 1us before ResetAfter: %+v; want Remaining %d, ResetAfter 1us", r, got, r.burst-1)
		}
		clk.set(at + reset)
		if _, got := decideOne(t, s, r, key, 0); got.Remaining != r.burst || got.ResetAfter != 0 {
			t.Fatalf("%s: at ResetAfter: %+v; want a full bucket", r, got)
		}
	}
}

func TestCostZeroOnlyLooks(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	r := mustRule(t, "z", 3, time.Second, 0)
	ok, res := decideOne(t, s, r, "k", 0)
	if !ok || public(res) != (Result{Allowed: true, Remaining: 3}) {
		t.Fatalf("look at a fresh bucket: %v %+v", ok, res)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("a look stored %d buckets", n)
	}
	for range 3 {
		decideOne(t, s, r, "k", 1)
	}
	for range 5 {
		ok, res = decideOne(t, s, r, "k", 0)
		if !ok || res.Remaining != 0 || res.RetryAfter != 0 || res.ResetAfter != time.Second {
			t.Fatalf("look at an empty bucket: %v %+v; want allowed, nothing remaining, reset in 1s", ok, res)
		}
	}
	clk.add(333_334)
	if ok, _ := decideOne(t, s, r, "k", 1); !ok {
		t.Fatal("looks were charged: the refilled token is gone")
	}
}

func TestCostAboveBurstIsNever(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	r := mustRule(t, "z", 3, time.Second, 0)
	other := mustRule(t, "other", 10, time.Second, 0)
	for _, cost := range []int64{4, 5, 1 << 40} {
		ok, res := decideOne(t, s, r, "k", cost)
		if ok || res.RetryAfter != Never || res.Remaining != 3 || res.ResetAfter != 0 {
			t.Fatalf("cost %d on a full bucket of 3: %v %+v; want a denial with RetryAfter Never", cost, ok, res)
		}
		// Together with a zone that admits, nothing is charged.
		reqs := []Request{{Rule: other, Key: "k", Cost: 1}, {Rule: r, Key: "k", Cost: cost}}
		results := make([]Result, 2)
		ok, err := s.Decide(context.Background(), reqs, results)
		if err != nil || ok || !results[0].Allowed || results[0].Remaining != 10 || results[1].RetryAfter != Never {
			t.Fatalf("two zones, cost %d: %v %v %+v", cost, ok, err, results)
		}
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("denied requests stored %d buckets", n)
	}
	// Cost exactly the burst is admissible.
	if ok, res := decideOne(t, s, r, "k", 3); !ok || res.Remaining != 0 {
		t.Fatalf("cost == burst: %v %+v", ok, res)
	}
	if _, res := decideOne(t, s, r, "k", 3); res.RetryAfter != time.Second {
		t.Fatalf("cost == burst on an empty bucket: %+v; want RetryAfter 1s", res)
	}
}

// TestStateUnderAnotherRule reads states written under one rule with
// another (a zone whose rule changed on reload): the debt stays within
// [0, capacity] and the results within the new rule's bounds.
func TestStateUnderAnotherRule(t *testing.T) {
	t.Parallel()
	rules := []*Rule{
		mustRule(t, "z", 3, time.Second, 0),
		mustRule(t, "z", 7, time.Second, 1),
		mustRule(t, "z", 999, time.Minute, 0),
		mustRule(t, "z", 12345, time.Second, 0),
		mustRule(t, "z", 1000, time.Microsecond, 0),
		mustRule(t, "z", 1, 24*time.Hour, 1000),
		mustRule(t, "z", 1, 1000*time.Hour, 100),
	}
	check := func(r *Rule, s State, now, cost int64) {
		t.Helper()
		d := r.debt(s, now)
		if d < 0 || d > r.capacity {
			t.Fatalf("%s: debt(%d, %d) = %d, outside [0, %d]", r, s, now, d, r.capacity)
		}
		v := r.check(s, now, cost, 0)
		for _, charged := range []bool{false, v.ok} {
			res := r.result(v, charged, cost)
			if res.Remaining < 0 || res.Remaining > r.burst || res.ResetAfter < 0 ||
				(res.RetryAfter < 0 && res.RetryAfter != Never) || res.Allowed != v.ok {
				t.Fatalf("%s: state %d at %d cost %d: %+v", r, s, now, cost, res)
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200_000 {
		w, r := rules[rng.IntN(len(rules))], rules[rng.IntN(len(rules))]
		now := epoch + rng.Int64N(1e12)
		after := rng.Int64N(w.capacity + 1)
		s := w.stateAt(now, after)
		at := now + rng.Int64N(2*w.capacity/w.denom+2) - w.capacity/w.denom
		check(r, s, at, rng.Int64N(r.burst+2))
		// Arbitrary stored integers: any ticks, any time.
		check(r, State(now*fracScale+rng.Int64N(fracScale)), at, 1)
	}
	// Through a store: the same zone name and key under a changed rule.
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	for range 20_000 {
		r := rules[rng.IntN(len(rules))]
		_, res := decideOne(t, s, r, "k", rng.Int64N(r.burst+1))
		if res.Remaining < 0 || res.Remaining > r.burst {
			t.Fatalf("%s: %+v", r, res)
		}
		clk.add(rng.Int64N(100_000))
	}
}

// idealBucket is a token bucket written from its definition, in exact
// integers and independently of the code under test: it counts tokens in
// units of 1/perUS token, so that refilling rate tokens per period adds
// exactly rate units every microsecond.
type idealBucket struct {
	rate, perUS, burst int64
	units              int64 // tokens x perUS
	last               int64 // microsecond of the last refill
	capped             bool  // some refill was lost because the bucket was full
}

func newIdealBucket(rate int64, per time.Duration, burst, start int64) *idealBucket {
	perUS := int64(per / time.Microsecond)
	return &idealBucket{rate: rate, perUS: perUS, burst: burst, units: burst * perUS, last: start}
}

func (b *idealBucket) refill(now int64) {
	if now <= b.last {
		return
	}
	full := b.burst * b.perUS
	room, dt := full-b.units, now-b.last
	b.last = now
	if dt > room/b.rate { // rate*dt > room
		b.capped = true
		b.units = full
		return
	}
	b.units += b.rate * dt
}

func (b *idealBucket) decide(now, cost int64) Result {
	b.refill(now)
	full := b.burst * b.perUS
	ceil := func(a, b int64) int64 { return (a + b - 1) / b }
	if cost > b.burst {
		return Result{Remaining: b.units / b.perUS, RetryAfter: Never,
			ResetAfter: time.Duration(ceil(full-b.units, b.rate)) * time.Microsecond}
	}
	want := cost * b.perUS
	if b.units < want {
		return Result{Remaining: b.units / b.perUS,
			RetryAfter: time.Duration(ceil(want-b.units, b.rate)) * time.Microsecond,
			ResetAfter: time.Duration(ceil(full-b.units, b.rate)) * time.Microsecond}
	}
	b.units -= want
	return Result{Allowed: true, Remaining: b.units / b.perUS,
		ResetAfter: time.Duration(ceil(full-b.units, b.rate)) * time.Microsecond}
}

// TestArithmeticMatchesIdealBucket runs random traces (random costs, gaps
// from nothing to days) through the memory store and the ideal bucket:
// every Result is the same.
func TestArithmeticMatchesIdealBucket(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rate  int64
		per   time.Duration
		burst int64
	}{
		{3, time.Second, 3}, {7, time.Second, 1}, {100, time.Minute, 5}, {999, time.Minute, 999},
		{10, 1500 * time.Millisecond, 4}, {1000, time.Microsecond, 7}, {1, 24 * time.Hour, 1000},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%d per %s burst %d", tc.rate, tc.per, tc.burst), func(t *testing.T) {
			t.Parallel()
			r := mustRule(t, "z", tc.rate, tc.per, tc.burst)
			if !r.exact {
				t.Fatalf("%s is not exact", r)
			}
			clk := newTestClock(epoch)
			s := newMemory(t, clk)
			ideal := newIdealBucket(tc.rate, tc.per, tc.burst, epoch)
			token := max(1, int64(tc.per/time.Microsecond)/tc.rate)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for n := range 50_000 {
				switch rng.IntN(10) {
				case 0, 1, 2: // same instant
				case 3, 4, 5:
					clk.add(rng.Int64N(token + 1))
				case 6, 7, 8:
					clk.add(rng.Int64N(4*token + 1))
				default: // up to three times a full refill, and at most a day
					clk.add(rng.Int64N(min(tc.burst*token*3, 86_400_000_000) + 1))
				}
				cost := rng.Int64N(tc.burst + 1)
				if rng.IntN(20) == 0 {
					cost = tc.burst + 1 + rng.Int64N(3)
				}
				want := ideal.decide(clk.now(), cost)
				ok, got := decideOne(t, s, r, "k", cost)
				if public(got) != want || ok != want.Allowed {
					t.Fatalf("decision %d at +%dus, cost %d: got %v %+v, want %+v", n, clk.now()-epoch, cost, ok, got, want)
				}
			}
		})
	}
}

// TestExactOverAMillionDecisions is the exactness test: demand
// always exceeds supply (a client asks again at once after every admission,
// and again a small random time after every denial), and over a million
// decisions the count admitted is exactly floor(burst + rate x elapsed /
// per), computed in math/big, never more at any prefix of the trace.
func TestExactOverAMillionDecisions(t *testing.T) {
	t.Parallel()
	cases := []exactCase{
		{3, time.Second, 3},
		{7, time.Second, 1},
		{100, time.Minute, 5},
		{999, time.Minute, 0},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%d per %s burst %d", tc.rate, tc.per, tc.burst), func(t *testing.T) {
			t.Parallel()
			burst := tc.burst
			if burst == 0 {
				burst = tc.rate // the documented default
			}
			clk := newTestClock(epoch + int64(i)*1_234_567)
			ideal := newIdealBucket(tc.rate, tc.per, burst, clk.now())
			first := clk.now()
			admitted := tc.decideAMillion(t, i, burst, clk, ideal)
			tc.checkAdmittedExactly(t, burst, admitted, ideal, first)
		})
	}
}

// exactCase is a token bucket of TestExactOverAMillionDecisions.
type exactCase struct {
	rate  int64
	per   time.Duration
	burst int64
}

// decideAMillion decides a million requests of one client on the memory
// store, each as the ideal bucket does, and never admitting more than
// burst + rate x elapsed / per at any prefix; it returns how many it
// admitted.
func (tc exactCase) decideAMillion(t *testing.T, i int, burst int64, clk *testClock, ideal *idealBucket) int64 {
	r := mustRule(t, "z", tc.rate, tc.per, tc.burst)
	perUS := int64(tc.per / time.Microsecond)
	// Steps of at most half a token's refill time: with a burst
	// of 2 or more, a drained bucket never fills up between two
	// decisions, so no refill is ever lost.
	maxStep := perUS / tc.rate / 2
	s := newMemory(t, clk)
	rng := rand.New(rand.NewPCG(uint64(i), 11))
	first := clk.now()
	reqs := []Request{{Rule: r, Key: "client", Cost: 1}}
	results := make([]Result, 1)
	var admitted int64
	for n := range 1_000_000 {
		now := clk.now()
		ok, err := s.Decide(context.Background(), reqs, results)
		if err != nil {
			t.Fatal(err)
		}
		if want := ideal.decide(now, 1); public(results[0]) != want || ok != want.Allowed {
			t.Fatalf("decision %d at +%dus: got %v %+v, the ideal bucket says %+v", n, now-first, ok, results[0], want)
		}
		if ok {
			admitted++
			// admitted <= burst + rate*elapsed/per, in integers.
			if admitted*perUS > burst*perUS+tc.rate*(now-first) {
				t.Fatalf("decision %d at +%dus: %d admitted, more than %d + %d x %dus / %dus",
					n, now-first, admitted, burst, tc.rate, now-first, perUS)
			}
			continue
		}
		clk.add(1 + rng.Int64N(maxStep))
	}
	return admitted
}

// checkAdmittedExactly compares admitted with floor(burst + rate x
// elapsed / per) in exact rationals: equal with a burst of 2 or more,
// never above with a burst of 1.
func (tc exactCase) checkAdmittedExactly(t *testing.T, burst, admitted int64, ideal *idealBucket, first int64) {
	perUS := int64(tc.per / time.Microsecond)
	last := ideal.last
	// floor(burst + rate*(last-first)/per) in exact rationals.
	bound := new(big.Rat).SetFrac(
		new(big.Int).Mul(big.NewInt(tc.rate), big.NewInt(last-first)),
		big.NewInt(perUS))
	bound.Add(bound, new(big.Rat).SetInt64(burst))
	want := new(big.Int).Quo(bound.Num(), bound.Denom()) // positive: truncation is floor
	t.Logf("%d admitted over %.1f simulated hours; bound %s", admitted, float64(last-first)/3.6e9, want)
	if burst >= 2 {
		if ideal.capped {
			t.Fatal("the trace let the bucket fill up: demand did not exceed supply")
		}
		if want.Cmp(big.NewInt(admitted)) != 0 {
			t.Fatalf("admitted %d, want exactly %s", admitted, want)
		}
		return
	}
	// With a burst of 1 every admission finds a full bucket, and
	// whole-microsecond request times lose the fraction of a
	// microsecond by which a token's refill time (1/7 s here) is
	// not whole: no trace can reach the bound, so the count is
	// the ideal bucket's (checked decision by decision above),
	// and never above the bound.
	if want.Cmp(big.NewInt(admitted)) < 0 {
		t.Fatalf("admitted %d, more than %s", admitted, want)
	}
}
