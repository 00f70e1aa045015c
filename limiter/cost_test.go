package limiter

import (
	"context"
	"math"
	"testing"
	"time"
)

// TestHugeCostIsNever sends the largest costs a client can name (a cost
// from a header) to every algorithm, on the memory store and on a
// limiter's local fallback: each is denied with RetryAfter Never, charges
// nothing, and the key's next request of cost 1 is admitted as before.
// (cost + reserve once wrapped negative on the windows and was admitted,
// corrupting the window.)
func TestHugeCostIsNever(t *testing.T) {
	t.Parallel()
	rules := []*Rule{
		mustRule(t, "tb", 3, time.Second, 3),
		mustAlgRule(t, "fw", FixedWindow, 3, time.Minute, 0, 0),
		mustAlgRule(t, "sw", SlidingWindow, 3, time.Minute, 0, 0),
		mustAlgRule(t, "log", SlidingLog, 3, time.Minute, 0, 0),
		mustAlgRule(t, "lb", LeakyBucket, 3, time.Second, 3, 0),
	}
	for _, r := range rules {
		for _, reserve := range []int64{0, 50, 99} {
			for _, cost := range []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2, 1 << 62, 4} {
				clk := newTestClock(epoch)
				s := newMemory(t, clk)
				reqs := []Request{{Rule: r, Key: "k", Cost: cost, Reserve: reserve}}
				results := make([]Result, 1)
				ok, err := s.Decide(context.Background(), reqs, results)
				if err != nil || ok || results[0].Allowed || results[0].RetryAfter != Never {
					t.Fatalf("%s: cost %d reserve %d: %v %v %+v; want a denial with RetryAfter Never", r.name, cost, reserve, ok, err, results[0])
				}
				if ok, res := decideOne(t, s, r, "k", 1); !ok || res.Remaining != 2 {
					t.Fatalf("%s: after cost %d reserve %d, a request of cost 1: %v %+v; want admitted with 2 left", r.name, cost, reserve, ok, res)
				}
			}
		}
	}
}
