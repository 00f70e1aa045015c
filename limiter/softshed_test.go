package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestSoftShedDelays: on both stores, a key of a zone of 10/s with
// soft_shed 80 (a max delay of 1s) passes its first 8 tokens at once, the
// 9th after 100ms and the 10th after 200ms (the time the rate takes to
// refill one and two tokens past the threshold), and is denied at the
// 11th; with a max delay of 150ms the 10th waits 150ms; a request of cost 0 is never
// delayed; a request that another zone denies is not delayed either; and
// a dry-run zone reports the delay it would ask.
func TestSoftShedDelays(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	shed := mustConfig(t, RuleConfig{Name: "shed", Rate: 10, Per: time.Second, SoftShed: 80})
	dry := mustConfig(t, RuleConfig{Name: "dry", Rate: 10, Per: time.Second, SoftShed: 80, DryRun: true})
	capped := mustConfig(t, RuleConfig{Name: "capped", Rate: 10, Per: time.Second, SoftShed: 80, SoftShedMaxDelay: 150 * time.Millisecond})
	strict := mustConfig(t, RuleConfig{Name: "strict", Rate: 1, Per: time.Hour, Burst: 1})
	if pct, d := shed.SoftShed(); pct != 80 || d != DefaultSoftShedMaxDelay {
		t.Fatalf("SoftShed() = %d, %s; want 80, the default 1s", pct, d)
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			clk := newTestClock(epoch)
			var s Store = newMemory(t, clk)
			if store == "redis" {
				s = newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "shed:", Clock: clk})
			}
			decide := func(reqs ...Request) (bool, []Result) {
				t.Helper()
				res := make([]Result, len(reqs))
				ok, err := s.Decide(context.Background(), reqs, res)
				if err != nil {
					t.Fatal(err)
				}
				return ok, res
			}
			want := []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, 100 * time.Millisecond, 200 * time.Millisecond}
			for i, d := range want {
				if i == 8 {
					// A look (cost 0) past the threshold is not delayed.
					if ok, res := decide(Request{Rule: shed, Key: "k", Cost: 0}); !ok || res[0].Delay != 0 {
						t.Fatalf("a request of cost 0 past the threshold: %v %+v, want admitted, no delay", ok, res[0])
					}
					// Nor is one that another zone denies.
					decide(Request{Rule: strict, Key: "k", Cost: 1})
					if ok, res := decide(Request{Rule: shed, Key: "k", Cost: 1}, Request{Rule: strict, Key: "k", Cost: 1}); ok || res[0].Delay != 0 {
						t.Fatalf("a request another zone denied: %v %+v, want denied, no delay", ok, res[0])
					}
				}
				ok, res := decide(Request{Rule: shed, Key: "k", Cost: 1})
				if !ok || res[0].Delay != d {
					t.Fatalf("request %d: %v, delay %s; want admitted after %s", i+1, ok, res[0].Delay, d)
				}
				_, res = decide(Request{Rule: dry, Key: "k", Cost: 1})
				if !res[0].Allowed || res[0].DryRun || res[0].Delay != d {
					t.Fatalf("dry run, request %d: %+v; want a delay of %s reported", i+1, res[0], d)
				}
				_, res = decide(Request{Rule: capped, Key: "k", Cost: 1})
				if want := min(d, 150*time.Millisecond); !res[0].Allowed || res[0].Delay != want {
					t.Fatalf("max delay 150ms, request %d: %+v; want a delay of %s", i+1, res[0], want)
				}
			}
			if ok, res := decide(Request{Rule: shed, Key: "k", Cost: 1}); ok || res[0].Delay != 0 {
				t.Fatalf("the 11th request: %v %+v; want denied, as without soft shedding", ok, res[0])
			}
			// A second and a half later, 15 tokens are back (the bucket
			// is full): the next request is not delayed.
			clk.add(int64(1500 * time.Millisecond / time.Microsecond))
			if ok, res := decide(Request{Rule: shed, Key: "k", Cost: 1}); !ok || res[0].Delay != 0 {
				t.Fatalf("after the refill: %v %+v; want admitted at once", ok, res[0])
			}
		})
	}
}

// TestSoftShedRule: soft shedding is for token buckets only, with a
// percentage from 1 to 99 and a max delay of at most an hour; the local
// fallback bucket sheds softly as its zone does, from its own burst.
func TestSoftShedRule(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  RuleConfig
		want error
	}{
		{RuleConfig{Name: "a", Algorithm: LeakyBucket, Rate: 1, Per: time.Second, SoftShed: 80}, ErrSoftShedNotApplicable},
		{RuleConfig{Name: "a", Algorithm: FixedWindow, Rate: 1, Per: time.Second, SoftShed: 80}, ErrSoftShedNotApplicable},
		{RuleConfig{Name: "a", Rate: 1, Per: time.Second, SoftShed: 100}, ErrBadSoftShed},
		{RuleConfig{Name: "a", Rate: 1, Per: time.Second, SoftShed: -1}, ErrBadSoftShed},
		{RuleConfig{Name: "a", Rate: 1, Per: time.Second, SoftShedMaxDelay: time.Second}, ErrBadSoftShed},
		{RuleConfig{Name: "a", Rate: 1, Per: time.Second, SoftShed: 50, SoftShedMaxDelay: 2 * time.Hour}, ErrBadSoftShed},
	} {
		if _, err := NewRule(c.cfg); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.cfg, err, c.want)
		}
	}
	r := mustConfig(t, RuleConfig{Name: "z", Rate: 100, Per: time.Second, Burst: 100, SoftShed: 50, SoftShedMaxDelay: 200 * time.Millisecond})
	local, n := r.localFor(4)
	if pct, d := local.SoftShed(); n != 4 || pct != 50 || d != 200*time.Millisecond || local.Burst() != 25 {
		t.Fatalf("the local rule for 4 nodes: burst %d, soft shed %d%% %s; want 25, 50%% 200ms", local.Burst(), pct, d)
	}
	// A rate of 3/s: ticks of a third of a microsecond, the delay
	// rounded up to the microsecond.
	third := mustConfig(t, RuleConfig{Name: "third", Rate: 3, Per: time.Second, Burst: 3, SoftShed: 33})
	if d := third.shedDelay(third.interval, 1); d != 3334 { // 0.01 token past 0.99: 3333.3us
		t.Fatalf("the first token of 3/s past 33%% waits %dus, want 3334", d)
	}
}

// TestSoftShedFewerDenials: a client that sends as fast as it can, four
// requests at a time, each sent when the previous one's answer came (2ms
// after it was decided, or after its delay), against a zone of 200/s with
// a burst of 50, for 5 simulated seconds on each store: with soft_shed 80
// it is denied far less and admitted as much (within 2%; the band's
// tokens left at the end are the difference), never more than the bound.
// Time is stretched 3600 times (an hour for a second), so that Redis,
// which expires a bucket in real time, never drops one that the simulated
// clock still counts, however slowly the trace runs.
func TestSoftShedFewerDenials(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const (
		stretch     = 3600
		rate, burst = 200, 50
		workers     = 4
		rtt         = int64(2 * stretch * time.Millisecond / time.Microsecond)
		run         = int64(5 * stretch * time.Second / time.Microsecond)
	)
	plain := mustConfig(t, RuleConfig{Name: "plain", Rate: rate, Per: stretch * time.Second, Burst: burst})
	shed := mustConfig(t, RuleConfig{Name: "soft", Rate: rate, Per: stretch * time.Second, Burst: burst,
		SoftShed: 80, SoftShedMaxDelay: stretch * time.Second})
	bound := burst + rate*run/int64(stretch*time.Second/time.Microsecond)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			flood := func(r *Rule) (admitted, denied int64) {
				clk := newTestClock(epoch)
				var s Store = newMemory(t, clk)
				if store == "redis" {
					s = newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "flood:", Clock: clk})
				}
				next := make([]int64, workers) // when each worker sends next, from the start
				for range 4 * run / rtt * workers {
					w := 0
					for i := range next {
						if next[i] < next[w] {
							w = i
						}
					}
					if next[w] >= run {
						break
					}
					clk.set(epoch + next[w])
					res := make([]Result, 1)
					ok, err := s.Decide(context.Background(), []Request{{Rule: r, Key: "client", Cost: 1}}, res)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						admitted++
						next[w] += int64(res[0].Delay/time.Microsecond) + rtt
					} else {
						denied++
						next[w] += rtt
					}
				}
				return admitted, denied
			}
			a0, d0 := flood(plain)
			a1, d1 := flood(shed)
			t.Logf("%s, %d workers, 5s at 200/s burst 50 (bound %d): without soft_shed %d admitted, %d denied; with soft_shed 80: %d admitted, %d denied",
				store, workers, bound, a0, d0, a1, d1)
			if a0 > bound || a1 > bound {
				t.Fatalf("admitted %d and %d, beyond the bound %d", a0, a1, bound)
			}
			if d1*10 > d0 {
				t.Errorf("soft shedding denied %d, without it %d: want far fewer", d1, d0)
			}
			if diff := a0 - a1; diff*50 > a0 || -diff*50 > a0 {
				t.Errorf("admitted %d with soft shedding, %d without: want the same within 2%%", a1, a0)
			}
		})
	}
}

// TestSoftShedFromSpares: a request that a node admits from its prefetched
// spares is delayed by what the zone holds from the node's view (the
// store's remaining at the prefetch, less what the node used since), as
// the store would delay it.
func TestSoftShedFromSpares(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	cs := &countingStore{Store: newMemory(t, clk)}
	l := New(cs, Options{})
	defer l.Close()
	r := mustConfig(t, RuleConfig{Name: "pf", Rate: 100, Per: time.Second, Burst: 100, Prefetch: 20, SoftShed: 50, SoftShedMaxDelay: time.Second})
	ctx := context.Background()
	res := make([]Result, 1)
	// 60 tokens taken from the store, by a rule of the same bucket
	// without prefetch.
	fill := mustConfig(t, RuleConfig{Name: "pf", Rate: 100, Per: time.Second, Burst: 100})
	for range 60 {
		if ok, err := cs.Store.Decide(ctx, []Request{{Rule: fill, Key: "k", Cost: 1}}, res); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	// The prefetch: the 61st token and 9 spares (a quarter of 39).
	if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Allowed || res[0].spares != 9 {
		t.Fatalf("prefetch: %v %+v", out, res[0])
	}
	calls := cs.calls.Load()
	if want := 110 * time.Millisecond; res[0].Delay != want { // 11 tokens past the threshold, 10ms each
		t.Fatalf("the prefetching request waits %s, want %s", res[0].Delay, want)
	}
	for i := range 9 {
		if out := l.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: 1}}, res); out != Allowed {
			t.Fatalf("spare %d: %v", i, out)
		}
		if want := time.Duration(12+i) * 10 * time.Millisecond; res[0].Delay != want {
			t.Fatalf("spare %d waits %s, want %s (%d tokens into the band)", i, res[0].Delay, want, 12+i)
		}
	}
	if cs.calls.Load() != calls {
		t.Fatalf("the spares asked the store")
	}
}

// ExampleRuleConfig_softShed shows a zone's delays with soft_shed 80.
func ExampleRuleConfig_softShed() {
	r, _ := NewRule(RuleConfig{Name: "api", Rate: 10, Per: time.Second, SoftShed: 80, SoftShedMaxDelay: time.Second})
	s := NewMemoryStore(MemoryOptions{Clock: ClockFunc(func() time.Time { return time.UnixMicro(epoch) })})
	defer s.Close()
	for i := 1; i <= 11; i++ {
		res := make([]Result, 1)
		ok, _ := s.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
		fmt.Print(i, ":", ok, " ", res[0].Delay, "  ")
	}
	// Output: 1:true 0s  2:true 0s  3:true 0s  4:true 0s  5:true 0s  6:true 0s  7:true 0s  8:true 0s  9:true 100ms  10:true 200ms  11:false 0s
}
