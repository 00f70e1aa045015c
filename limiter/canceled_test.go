package limiter

import (
	"context"
	"testing"
	"time"
)

// canceledStore answers as a store does when the request's context ended
// while it waited.
type canceledStore struct{}

func (canceledStore) Decide(ctx context.Context, _ []Request, _ []Result) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func (canceledStore) Refund(context.Context, []Request, []Result) error { return nil }

// TestCanceledIsNotAFailure: a request whose client goes away, while the
// store decides or while it waits for another request's answer on the deny
// cache, is Canceled: neither a decision nor a store failure, and no zone's
// failure policy applies.
func TestCanceledIsNotAFailure(t *testing.T) {
	t.Parallel()
	r := mustConfig(t, RuleConfig{Name: "api", Rate: 10, Per: time.Second, Burst: 0, OnError: PolicyDeny, FleetSize: 0})
	reqs := []Request{{Rule: r, Key: "k", Cost: 1}}

	// In the store.
	l := New(canceledStore{}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	if got := l.Decide(ctx, reqs, make([]Result, 1)); got != Canceled {
		t.Fatalf("client gone during the store call: %v, want canceled", got)
	}
	if l.Failures() != 0 {
		t.Fatalf("a gone client counted as %d store failures", l.Failures())
	}

	// Waiting on the deny cache for another request's answer about the
	// same bucket.
	ten := mustRule(t, "ten", 10, time.Second, 10) // a token each 100 ms, full after 1 s
	reqs = []Request{{Rule: ten, Key: "k", Cost: 10}}
	slow := &countingStore{Store: NewMemoryStore(MemoryOptions{Sweep: time.Hour})}
	t.Cleanup(func() { _ = slow.Store.(*MemoryStore).Close() })
	lc := New(slow, Options{Cache: NewDenyCache(DenyCacheOptions{})})
	// The cache learns the bucket (empty after this); once a token is
	// back the next request claims it and asks the store, which is slow
	// now, and a request for the same bucket waits for that answer.
	if got := lc.Decide(context.Background(), reqs, make([]Result, 1)); got != Allowed {
		t.Fatalf("first request: %v", got)
	}
	time.Sleep(130 * time.Millisecond) // a token back, and far from full
	reqs[0].Cost = 1
	slow.delay = 400 * time.Millisecond
	first := make(chan Outcome)
	go func() { first <- lc.Decide(context.Background(), reqs, make([]Result, 1)) }()
	for deadline := time.Now().Add(5 * time.Second); slow.calls.Load() < 2; { // the first request is in the store
		if time.Now().After(deadline) {
			t.Fatal("the first request did not reach the store in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	if got := lc.Decide(ctx, reqs, make([]Result, 1)); got != Canceled {
		t.Fatalf("client gone while waiting on the deny cache: %v, want canceled", got)
	}
	if got := <-first; got != Allowed {
		t.Fatalf("the first request: %v, want admitted", got)
	}
	if lc.Failures() != 0 {
		t.Fatalf("a gone client counted as %d store failures", lc.Failures())
	}
}
