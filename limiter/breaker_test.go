package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	t.Parallel()
	b := NewBreaker(3, 50*time.Millisecond)
	for i := range 2 {
		b.Failure()
		if !b.Allow() || b.State() != BreakerClosed {
			t.Fatalf("after %d failures the breaker must stay closed", i+1)
		}
	}
	b.Success() // a success resets the count
	b.Failure()
	b.Failure()
	if b.State() != BreakerClosed {
		t.Fatal("two failures after a success must not open it")
	}
	b.Failure()
	if b.State() != BreakerOpen || b.Allow() {
		t.Fatalf("three in a row must open it: %v", b.State())
	}
	if d := b.RetryAfter(); d <= 0 || d > 50*time.Millisecond {
		t.Fatalf("RetryAfter %s, want within the cooldown", d)
	}
	time.Sleep(60 * time.Millisecond)
	if b.State() != BreakerHalfOpen {
		t.Fatalf("after the cooldown: %v, want half-open", b.State())
	}
	if !b.Allow() {
		t.Fatal("the first caller after the cooldown is the probe")
	}
	if b.Allow() {
		t.Fatal("only one probe at a time")
	}
	b.Failure() // the probe failed: open again at once
	if b.State() != BreakerOpen || b.Opened() != 2 {
		t.Fatalf("a failed probe must reopen it: %v, opened %d", b.State(), b.Opened())
	}
	time.Sleep(60 * time.Millisecond)
	if !b.Allow() {
		t.Fatal("second probe")
	}
	b.Success()
	if b.State() != BreakerClosed || !b.Allow() || !b.Allow() {
		t.Fatalf("a successful probe must close it: %v", b.State())
	}
}

// TestFailurePolicyLocal runs the limiter on a store that always fails:
// the local policy decides on this node's share of the limit, deny fails
// closed, allow fails open.
func TestFailurePolicyLocal(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	l := New(failingStore{}, Options{Local: newMemory(t, clk)})
	local := mustConfig(t, RuleConfig{Name: "search", Rate: 30, Per: time.Minute, Burst: 30, OnError: PolicyLocal, FleetSize: 3})
	if local.local.burst != 10 || local.local.per != 3*time.Minute || local.local.rate != 30 {
		t.Fatalf("local rule %v, want 30 per 3m (10 per minute), burst 10", local.local)
	}
	res := make([]Result, 1)
	admitted := 0
	for range 15 {
		switch l.Decide(context.Background(), []Request{{Rule: local, Key: "k", Cost: 1}}, res) {
		case LocalAllowed:
			admitted++
		case LocalDenied:
		default:
			t.Fatal("want a local decision")
		}
	}
	if admitted != 10 {
		t.Fatalf("local bucket admitted %d, want its burst of 10", admitted)
	}
	deny := mustConfig(t, RuleConfig{Name: "login", Rate: 5, Per: time.Minute, Burst: 5, OnError: PolicyDeny, FleetSize: 1})
	allow := mustConfig(t, RuleConfig{Name: "api", Rate: 5, Per: time.Minute, Burst: 5, OnError: PolicyAllow})
	two := []Result{{}, {}}
	if got := l.Decide(context.Background(), []Request{{Rule: allow, Key: "k", Cost: 1}, {Rule: deny, Key: "k", Cost: 1}}, two); got != FailedClosed {
		t.Fatalf("deny with allow: %v, want FailedClosed", got)
	}
	if two[1].Allowed || two[1].RetryAfter < time.Second {
		t.Fatalf("the deny zone's result %+v: want not allowed, RetryAfter >= 1s", two[1])
	}
	if got := l.Decide(context.Background(), []Request{{Rule: allow, Key: "k", Cost: 1}}, res); got != FailedOpen {
		t.Fatalf("allow: %v, want FailedOpen", got)
	}
	if l.Failures() != 17 {
		t.Fatalf("Failures() = %d, want 17", l.Failures())
	}
}

type failingStore struct{}

func (failingStore) Decide(context.Context, []Request, []Result) (bool, error) {
	return false, errors.New("store down")
}

func (failingStore) Refund(context.Context, []Request, []Result) error {
	return errors.New("redis: connection refused")
}
