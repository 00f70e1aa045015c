package limiter

import (
	"testing"
	"time"
)

// TestLeakyBucketDefaultMaxDelay: without max_delay, a leaky bucket parks a
// request at most DefaultMaxDelay, not for as long as its queue lasts
// (`rate 1 1h` with burst 100 parked requests for about 100 hours): the
// request that would wait longer is denied, and told when it would not.
func TestLeakyBucketDefaultMaxDelay(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	s := newMemory(t, clk)
	r := mustAlgRule(t, "lb", LeakyBucket, 1, time.Hour, 100, 0)
	longest := time.Duration(0)
	for i := range 100 {
		ok, res := decideOne(t, s, r, "k", 1)
		if !ok {
			if res.RetryAfter <= 0 {
				t.Fatalf("request %d denied with RetryAfter %v", i, res.RetryAfter)
			}
			break
		}
		longest = max(longest, res.Delay)
	}
	if longest > DefaultMaxDelay {
		t.Fatalf("a request was parked for %v, want at most the default max_delay %v", longest, DefaultMaxDelay)
	}
	// A queue shorter than the default keeps its own bound.
	short := mustAlgRule(t, "lbs", LeakyBucket, 10, time.Second, 5, 0)
	if got := short.MaxDelay(); got != 500*time.Millisecond {
		t.Fatalf("a queue of 5 at 10/s: max delay %v, want 500ms (the queue)", got)
	}
}
