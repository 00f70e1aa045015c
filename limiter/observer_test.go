package limiter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// recorder is an Observer that keeps what it was told.
type recorder struct {
	mu       sync.Mutex
	calls    []error
	took     []time.Duration
	denied   []*Rule
	refunds  []error
	refunded []*Rule
}

func (r *recorder) Refunded(rule *Rule, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refunds = append(r.refunds, err)
	r.refunded = append(r.refunded, rule)
}

func (r *recorder) StoreDecided(took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, err)
	r.took = append(r.took, took)
}

func (r *recorder) CacheDenied(rule *Rule) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.denied = append(r.denied, rule)
}

// slowStore answers after a delay, with an error if set.
type slowStore struct {
	Store
	delay time.Duration
	err   error
}

func (s slowStore) Decide(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	time.Sleep(s.delay)
	if s.err != nil {
		return false, s.err
	}
	return s.Store.Decide(ctx, reqs, results)
}

// TestObserverSeesStoreCallsAndCacheHits: every store call is reported with
// its duration and error, and every request the deny cache answers is
// reported with the zone that denied it, and never as a store call.
func TestObserverSeesStoreCallsAndCacheHits(t *testing.T) {
	t.Parallel()
	clk := newTestClock(epoch)
	rec := &recorder{}
	store := slowStore{Store: newMemory(t, clk), delay: 2 * time.Millisecond}
	l := New(store, Options{Cache: NewDenyCache(DenyCacheOptions{}), Observer: rec})
	api := mustRule(t, "api", 1, time.Hour, 1)
	other := mustRule(t, "other", 100, time.Hour, 100)
	reqs := []Request{{Rule: other, Key: "k", Cost: 1}, {Rule: api, Key: "k", Cost: 1}}
	results := make([]Result, 2)
	want := []Outcome{Allowed, Denied, Denied, Denied}
	for i, w := range want {
		if got := l.Decide(context.Background(), reqs, results); got != w {
			t.Fatalf("decision %d: %v, want %v", i, got, w)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// The first decision asks the store and leaves api empty, which the
	// cache learns: the three denials are the cache's.
	if len(rec.calls) != 1 || rec.calls[0] != nil {
		t.Fatalf("store calls %v, want one successful call", rec.calls)
	}
	if rec.took[0] < 2*time.Millisecond {
		t.Errorf("store call took %s, want at least the store's 2ms", rec.took[0])
	}
	if len(rec.denied) != 3 || rec.denied[0] != api || rec.denied[2] != api {
		t.Fatalf("cache hits %v, want three by zone api", rec.denied)
	}
}

func TestObserverSeesStoreErrors(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	fail := errors.New("boom")
	l := New(slowStore{err: fail}, Options{Observer: rec})
	reqs := []Request{{Rule: mustRule(t, "api", 1, time.Hour, 1), Key: "k", Cost: 1}}
	results := make([]Result, 1)
	if got := l.Decide(context.Background(), reqs, results); got != FailedOpen {
		t.Fatalf("outcome %v, want FailedOpen", got)
	}
	if len(rec.calls) != 1 || !errors.Is(rec.calls[0], fail) {
		t.Fatalf("store calls %v, want the store's error", rec.calls)
	}
}

// TestNoObserverNoClock: without an observer the limiter does not read the
// clock for it.
func TestNoObserverNoClock(t *testing.T) {
	l := New(slowStore{}, Options{})
	if !l.observeStart().IsZero() {
		t.Fatal("observeStart read the clock without an observer")
	}
}

// TestObserverRefunds: a refund is reported per zone, applied when the
// store takes it back, dropped (with the store's error) when it fails.
func TestObserverRefunds(t *testing.T) {
	rule, err := NewRule(RuleConfig{Name: "login", Rate: 5, Per: time.Minute, Refunds: true})
	if err != nil {
		t.Fatal(err)
	}
	mem := NewMemoryStore(MemoryOptions{})
	defer mem.Close()
	rec := &recorder{}
	l := New(mem, Options{Observer: rec})
	reqs := []Request{{Rule: rule, Key: "k", Cost: 1}}
	res := make([]Result, 1)
	if out := l.Decide(context.Background(), reqs, res); out != Allowed || res[0].Remaining != 4 {
		t.Fatalf("decide: %v %+v", out, res[0])
	}
	if err := l.Refund(context.Background(), Allowed, reqs, res); err != nil {
		t.Fatal(err)
	}
	again := make([]Result, 1)
	if l.Decide(context.Background(), reqs, again); again[0].Remaining != 4 {
		t.Fatalf("after the refund the bucket holds %d, want 4 again (5, less this request)", again[0].Remaining)
	}
	down := New(failingStore{}, Options{Observer: rec})
	if err := down.Refund(context.Background(), Allowed, reqs, res); err == nil {
		t.Fatal("a failing store's refund reported no error")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.refunds) != 2 || rec.refunds[0] != nil || rec.refunds[1] == nil || rec.refunded[0] != rule {
		t.Fatalf("observer saw refunds %v for %v, want one applied then one dropped for the rule", rec.refunds, rec.refunded)
	}
	if asked, lost := down.Refunds(); asked != 1 || lost != 1 {
		t.Fatalf("Refunds() = %d asked, %d lost; want 1, 1", asked, lost)
	}
}
