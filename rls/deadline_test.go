package rls

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestRedisHangs pauses Redis (SIGSTOP) under the service, with Redis'
// default timeout (25ms): every call of the Envoy emulator is answered
// within the store's timeout by the on_error policy (deny: OVER_LIMIT;
// allow: OK; local: this node's own bucket of 3), never with an error.
// The calls get a deadline of a second, of which the decision may wait
// half: an answer within hangBound shows the store's timeout ended the
// wait. hangBound is ten times the timeout, a margin for a loaded machine,
// not the figure: Envoy's 20ms, under which the decision waits 10ms, is
// measured by `go run ./cmd/bench -rls-hang` (docs/performance.md) across
// thousands of calls; an assertion on it fails whenever the machine is
// busy. The latencies are logged.
func TestRedisHangs(t *testing.T) {
	const hangBound = 250 * time.Millisecond
	for _, c := range []struct {
		policy string
		want   []string // the answers of the calls, the last repeating
	}{
		{"deny", []string{"OVER_LIMIT: OVER_LIMIT"}},
		{"allow", []string{"OK: OK"}},
		{"local", []string{"OK: OK", "OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"}},
	} {
		t.Run(c.policy, func(t *testing.T) {
			srv := redistest.Start(t)
			a := startApp(t, map[string]string{"api.yaml": userConfig}, func(a *App) {
				a.Redis = &fleetlimit.RedisConfig{Address: srv.Addr}
				a.OnError = c.policy
			})
			e := newEnvoy(t, a.addr(0))
			e.timeout = time.Second
			waitDecided(t, e) // connected to Redis, script loaded
			srv.Pause()
			defer srv.Resume()
			var took []time.Duration
			for i := range 40 {
				start := time.Now()
				resp, err := e.call(&rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "hung")}})
				took = append(took, time.Since(start))
				if err != nil {
					t.Fatalf("call %d with Redis paused: %v after %s, want an answer by the policy", i, err, took[i])
				}
				if took[i] > hangBound {
					t.Fatalf("call %d with Redis paused: answered after %s, want within the store's timeout of 25ms (bound %s)", i, took[i], hangBound)
				}
				want := c.want[min(i, len(c.want)-1)]
				if got := answerCodes(resp); got != want {
					t.Fatalf("call %d with Redis paused: %s, want %s", i, got, want)
				}
			}
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			t.Logf("on_error %s, Redis paused: latency p50 %s, max %s", c.policy, took[len(took)/2], took[len(took)-1])
		})
	}
}

// waitDecided calls until the store decides (not a policy's answer): the
// first calls of a fresh Redis client may wait for its connection.
func waitDecided(t *testing.T, e *envoy) {
	t.Helper()
	patient := *e
	patient.timeout = 10 * time.Second
	patient.must("api", desc("warm", "up"))
}

// TestNoAnswerAfterDeadline: a call whose caller has gone by the time it
// is decided gets the context's status, not an answer.
func TestNoAnswerAfterDeadline(t *testing.T) {
	a := startApp(t, map[string]string{"api.yaml": userConfig}, nil)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	resp, err := a.service.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "late")}})
	if s, _ := status.FromError(err); resp != nil || s.Code() != codes.DeadlineExceeded {
		t.Fatalf("a call past its deadline: %v, %v; want no answer and DEADLINE_EXCEEDED", resp, err)
	}
}

// TestDecisionContext: the decision's context ends at half the time the
// call has left, as context.WithDeadline would, whether or not its Done
// channel was asked for before (it arms its timer only then); the call's
// end ends it, and a context derived from it ends with it.
func TestDecisionContext(t *testing.T) {
	t.Parallel()
	t.Run("deadline", decisionContextDeadline)
	t.Run("done before the deadline", decisionContextDoneBeforeDeadline)
	t.Run("the call ends", decisionContextCallEnds)
	t.Run("cancel", decisionContextCancel)
}

// decisionContextLeft is the time a call has left in TestDecisionContext.
const decisionContextLeft = 400 * time.Millisecond

// decisionContextDeadline lets the decision's context reach its deadline, Done asked for or not.
func decisionContextDeadline(t *testing.T) {
	const left = decisionContextLeft
	t.Parallel()
	parent, cancelParent := context.WithTimeout(context.Background(), left)
	defer cancelParent()
	before := time.Now()
	ctx, cancel := decisionContext(parent)
	defer cancel()
	pd, _ := parent.Deadline()
	d, ok := ctx.Deadline()
	if !ok || d.Before(before.Add(pd.Sub(before)/2)) || d.After(pd.Add(-pd.Sub(time.Now())/2)) {
		t.Fatalf("deadline %v (%v), want half of the %s left before %v", d, ok, left, pd)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err before the deadline: %v", err)
	}
	time.Sleep(time.Until(d))
	for end := time.Now().Add(left); ctx.Err() == nil && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err past the deadline, Done never asked for: %v, want %v", err, context.DeadlineExceeded)
	}
	select {
	case <-ctx.Done():
	case <-time.After(left):
		t.Fatalf("Done asked for after the deadline: not closed %s later", left)
	}
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err after Done: %v, want %v", err, context.DeadlineExceeded)
	}
}

// decisionContextDoneBeforeDeadline asks for Done first: it closes at the deadline, and a derived context ends with it.
func decisionContextDoneBeforeDeadline(t *testing.T) {
	const left = decisionContextLeft
	t.Parallel()
	parent, cancelParent := context.WithTimeout(context.Background(), left)
	defer cancelParent()
	ctx, cancel := decisionContext(parent)
	defer cancel()
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	d, _ := ctx.Deadline()
	select {
	case <-ctx.Done():
	case <-time.After(left):
		t.Fatalf("Done not closed at the deadline")
	}
	if now := time.Now(); now.Before(d) {
		t.Fatalf("Done closed %s before the deadline", d.Sub(now))
	}
	select {
	case <-child.Done():
	case <-time.After(left):
		t.Fatalf("a derived context did not end with the decision's")
	}
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err: %v, want %v", err, context.DeadlineExceeded)
	}
	if child.Value(valueKey{}) != nil || ctx.Value(valueKey{}) != nil {
		t.Fatalf("a value nobody set")
	}
}

// decisionContextCallEnds ends the call: the decision's context ends too, armed or not, and keeps the call's values.
func decisionContextCallEnds(t *testing.T) {
	const left = decisionContextLeft
	t.Parallel()
	for _, armed := range []bool{false, true} {
		base := context.WithValue(context.Background(), valueKey{}, "v")
		parent, cancelParent := context.WithTimeout(base, left)
		ctx, cancel := decisionContext(parent)
		if armed {
			ctx.Done()
		}
		cancelParent()
		if err := ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("armed %v: Err once the call ended: %v, want %v", armed, err, context.Canceled)
		}
		select {
		case <-ctx.Done():
		case <-time.After(left):
			t.Fatalf("armed %v: Done not closed when the call ended", armed)
		}
		if v := ctx.Value(valueKey{}); v != "v" {
			t.Fatalf("armed %v: the call's value: %v", armed, v)
		}
		cancel()
	}
}

// decisionContextCancel cancels the decision's context, and not the call's.
func decisionContextCancel(t *testing.T) {
	const left = decisionContextLeft
	t.Parallel()
	parent, cancelParent := context.WithTimeout(context.Background(), left)
	defer cancelParent()
	ctx, cancel := decisionContext(parent)
	cancel()
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after cancel: %v, want %v", err, context.Canceled)
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatalf("Done asked for after cancel: not closed")
	}
	if parent.Err() != nil {
		t.Fatalf("cancel ended the call's context: %v", parent.Err())
	}
}

// valueKey is a context key of TestDecisionContext.
type valueKey struct{}
