package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// month is the reference RLS server's month: 30 days.
const month = 30 * 24 * time.Hour

// TestFixedWindowWideCounts: a fixed window of a month (30 days, as Envoy's
// reference rate limit server counts one) admits 4,000,000 requests, more
// than the packed counters' 21 bits hold, in Redis and in memory alike:
// the count crosses 2^21 and goes on exactly, the window ends at a multiple
// of its length since the Unix epoch, and the next window starts empty.
func TestFixedWindowWideCounts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	// A month after a window's start, as the reference aligns windows.
	start := (epoch / month.Microseconds()) * month.Microseconds()
	clk := newTestClock(start + 3*24*time.Hour.Microseconds())
	stores := []Store{newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: clk}), newMemory(t, clk)}
	r := mustAlgRule(t, "month", FixedWindow, 4_000_000, month, 0, 0)
	for _, s := range stores {
		t.Run(fmt.Sprintf("%T", s), func(t *testing.T) {
			decide := func(cost int64) (bool, Result) {
				t.Helper()
				res := make([]Result, 1)
				ok, err := s.Decide(ctx, []Request{{Rule: r, Key: "k", Cost: cost}}, res)
				if err != nil {
					t.Fatal(err)
				}
				return ok, res[0]
			}
			left := 27 * 24 * time.Hour // until the window ends
			steps := []struct {
				cost      int64
				ok        bool
				remaining int64
			}{
				{2_000_000, true, 2_000_000},
				{200_000, true, 1_800_000}, // 2,200,000 counted: past 2^21
				{1_800_001, false, 1_800_000},
				{1_300_000, true, 500_000},
				{0, true, 500_000},
				{500_000, true, 0},
				{1, false, 0},
			}
			for i, st := range steps {
				ok, res := decide(st.cost)
				if ok != st.ok || res.Remaining != st.remaining || res.ResetAfter != left {
					t.Fatalf("step %d, cost %d: %v %+v, want %v with %d left, reset in %s", i, st.cost, ok, res, st.ok, st.remaining, left)
				}
				if !ok && res.RetryAfter != left {
					t.Fatalf("step %d: retry after %s, want the window's end in %s", i, res.RetryAfter, left)
				}
			}
			clk.add(left.Microseconds())
			if ok, res := decide(4_000_000); !ok || res.Remaining != 0 || res.ResetAfter != month {
				t.Fatalf("the next window: %v %+v, want all 4,000,000 admitted at once", ok, res)
			}
			clk.add(-left.Microseconds())
		})
	}
}

// TestFixedWindowWideStateChanges: a fixed window whose rate grows past
// 2^21 in a reload keeps its count, and so does one whose rate falls
// back; a wide count read by a sliding window or a token bucket of the same
// zone name is no state of theirs: they start fresh, in Redis and in
// memory.
func TestFixedWindowWideStateChanges(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	clk := newTestClock(epoch)
	small := mustAlgRule(t, "z", FixedWindow, 2_000_000, time.Hour, 0, 0)
	big := mustAlgRule(t, "z", FixedWindow, 5_000_000, time.Hour, 0, 0)
	sw := mustAlgRule(t, "z", SlidingWindow, 5, time.Hour, 0, 0)
	tb := mustRule(t, "z", 1, time.Hour, 5)
	for _, s := range []Store{newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: clk}), newMemory(t, clk)} {
		spend := func(r *Rule, key string, cost int64) Result {
			t.Helper()
			res := make([]Result, 1)
			if _, err := s.Decide(ctx, []Request{{Rule: r, Key: key, Cost: cost}}, res); err != nil {
				t.Fatal(err)
			}
			return res[0]
		}
		key := fmt.Sprintf("%T-grow", s)
		spend(small, key, 1_999_999)
		if res := spend(big, key, 2_000_000); !res.Allowed || res.Remaining != 1_000_001 {
			t.Errorf("%s: 1,999,999 under 2,000,000 per hour, then 2,000,000 under 5,000,000: %+v, want 1,000,001 left", key, res)
		}
		if res := spend(small, key, 0); res.Remaining != 0 {
			t.Errorf("%s: 3,999,999 counted, read under 2,000,000 per hour: %+v, want none left", key, res)
		}
		if res := spend(big, key, 1_000_001); !res.Allowed || res.Remaining != 0 {
			t.Errorf("%s: back under 5,000,000 per hour: %+v, want the last 1,000,001 admitted", key, res)
		}
		for _, r := range []*Rule{sw, tb} {
			key := fmt.Sprintf("%T-%s", s, r.alg)
			spend(big, key, 3_000_000)
			if res := spend(r, key, 4); !res.Allowed || res.Remaining != 1 {
				t.Errorf("%s: a wide fixed window's count, then %s: %+v, want a fresh limit (4 admitted, 1 left)", key, r.alg, res)
			}
		}
	}
}
