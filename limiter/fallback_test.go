package limiter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestDefaultPolicyIsLocal: a zone that names no failure policy keeps
// limiting on the node's share when the store fails.
func TestDefaultPolicyIsLocal(t *testing.T) {
	t.Parallel()
	if p, err := ParsePolicy(""); err != nil || p != PolicyLocal {
		t.Fatalf(`ParsePolicy("") = %v, %v; want local`, p, err)
	}
	if p, err := ParsePolicy("allow"); err != nil || p != PolicyAllow {
		t.Fatalf(`ParsePolicy("allow") = %v, %v`, p, err)
	}
	// A rule built without naming a policy is local too: the zero value.
	if r := mustRule(t, "api", 10, time.Second, 0); r.OnError() != PolicyLocal || r.LocalBucket() == "" {
		t.Fatalf("a rule without a policy: %v, local bucket %q; want local", r.OnError(), r.LocalBucket())
	}
}

// TestFailurePolicyLocalFleetView: a zone without a fixed fleet size
// divides its limit by the nodes the fleet view saw, follows the view when
// it grows but not when it shrinks (fleetDivisor), and logs the divisor once
// when the fallback starts.
func TestFailurePolicyLocalFleetView(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	var nodes atomic.Int64
	nodes.Store(4)
	core, logs := observer.New(zap.InfoLevel)
	l := New(failingStore{}, Options{Local: newMemory(t, clk), FleetSize: nodes.Load, Log: zap.New(core)})
	r := mustConfig(t, RuleConfig{Name: "api", Rate: 40, Per: time.Minute, Burst: 40, OnError: PolicyLocal, FleetSize: 0})
	count := func(key string, n int) int {
		res := make([]Result, 1)
		admitted := 0
		for range n {
			switch l.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, res) {
			case LocalAllowed:
				admitted++
			case LocalDenied:
			default:
				t.Fatal("want a local decision")
			}
		}
		return admitted
	}
	if got := count("a", 30); got != 10 {
		t.Fatalf("4 nodes: the local bucket admitted %d of a burst of 40, want 10", got)
	}
	nodes.Store(8)
	if got := count("b", 30); got != 5 {
		t.Fatalf("8 nodes: admitted %d, want 5", got)
	}
	// A view that sees fewer nodes (Redis restarted empty) does not
	// lower the divisor: the largest fleet of the last 10 minutes holds.
	nodes.Store(0)
	if got := count("c", 60); got != 5 {
		t.Fatalf("no view after one of 8 nodes: admitted %d, want 5", got)
	}
	starts := logs.FilterMessageSnippet("limit on this node's own buckets").All()
	if len(starts) != 1 {
		t.Fatalf("%d fallback start lines, want 1 (it is logged when the fallback starts)", len(starts))
	}
	if d := starts[0].ContextMap()["divisor"]; d != int64(4) {
		t.Fatalf("logged divisor %v, want 4", d)
	}

	// A fixed fleet_size wins over the view.
	fixed := mustConfig(t, RuleConfig{Name: "fixed", Rate: 40, Per: time.Minute, Burst: 40, OnError: PolicyLocal, FleetSize: 8})
	nodes.Store(2)
	res := make([]Result, 1)
	admitted := 0
	for range 20 {
		if l.Decide(context.Background(), []Request{{Rule: fixed, Key: "k", Cost: 1}}, res) == LocalAllowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("fleet_size 8: admitted %d, want 5", admitted)
	}
}

// TestNewRuleRejectsMisfits: NewRule validates the whole configuration:
// settings of another algorithm and a negative fleet size are errors.
func TestNewRuleRejectsMisfits(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  RuleConfig
		want error
	}{
		{"burst of a window", RuleConfig{Algorithm: FixedWindow, Rate: 5, Per: time.Second, Burst: 5}, ErrBurstNotApplicable},
		{"max delay of a token bucket", RuleConfig{Rate: 5, Per: time.Second, MaxDelay: time.Second}, ErrMaxDelayNotApplicable},
		{"negative max delay", RuleConfig{Algorithm: LeakyBucket, Rate: 5, Per: time.Second, MaxDelay: -1}, ErrMaxDelay},
		{"negative fleet size", RuleConfig{Rate: 5, Per: time.Second, OnError: PolicyDeny, FleetSize: -1}, ErrBadFleetSize},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Name = "z"
			if r, err := NewRule(tc.cfg); !errors.Is(err, tc.want) || r != nil {
				t.Fatalf("NewRule(%+v) = %v, %v; want error %v", tc.cfg, r, err, tc.want)
			}
		})
	}
}

// TestLocalFallbackKeepsBans: while the store fails, a zone's local
// buckets ban as the zone does: a key denied After times on this node is
// banned for the ban's duration, and the refill does not let it back in.
func TestLocalFallbackKeepsBans(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	l := New(failingStore{}, Options{Local: newMemory(t, clk)})
	r := mustConfig(t, RuleConfig{Name: "login", Rate: 10, Per: time.Second, Burst: 2, OnError: PolicyLocal,
		Ban: Ban{Duration: time.Hour, After: 3, Window: time.Minute}})
	decide := func() (Outcome, Result) {
		res := make([]Result, 1)
		out := l.Decide(context.Background(), []Request{{Rule: r, Key: "mallory", Cost: 1}}, res)
		return out, res[0]
	}
	var outs []Outcome
	for range 5 {
		out, _ := decide()
		outs = append(outs, out)
	}
	out, res := decide()
	if out != LocalDenied || !res.Banned || res.RetryAfter < 59*time.Minute {
		t.Fatalf("after %v, the next request: %v %+v; want denied, banned for about an hour", outs, out, res)
	}
	clk.add(int64(10 * time.Second / time.Microsecond)) // the bucket is full again
	if out, res := decide(); out != LocalDenied || !res.Banned {
		t.Fatalf("10 s later, the local bucket full again: %v %+v; want still banned", out, res)
	}
	if out, _ := func() (Outcome, Result) {
		res := make([]Result, 1)
		return l.Decide(context.Background(), []Request{{Rule: r, Key: "alice", Cost: 1}}, res), res[0]
	}(); out != LocalAllowed {
		t.Fatalf("another key: %v, want admitted locally", out)
	}
}
