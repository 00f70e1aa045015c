package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestPrefetchSparesRule: a decision takes min(prefetch − cost, ⌊left/4⌋)
// spares, none from a bucket left with fewer than 4 tokens, and reports the
// spares as still remaining to this node.
func TestPrefetchSparesRule(t *testing.T) {
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	r := mustConfig(t, RuleConfig{Name: "pf", Rate: 10, Per: time.Hour, Burst: 40, Prefetch: 20})
	// Left after each: 30, 22, 16, 12, 9, 6, 4, 3, 2, 1, 0.
	wantSpares := []int64{9, 7, 5, 3, 2, 2, 1, 0, 0, 0, 0}
	left := int64(40)
	for i, want := range wantSpares {
		if left < 1 {
			break
		}
		res := make([]Result, 1)
		ok, err := ms.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, res)
		if err != nil || !ok {
			t.Fatalf("decision %d: %v %v", i, ok, err)
		}
		if res[0].spares != want {
			t.Fatalf("decision %d with %d tokens: took %d spares, want %d", i, left, res[0].spares, want)
		}
		left -= 1 + want
		if res[0].Remaining != left+want {
			t.Fatalf("decision %d: remaining %d, want %d (the bucket's %d and the spares)", i, res[0].Remaining, left+want, left)
		}
	}
}

// TestPrefetchAdmitsFromSpares: a limiter admits from its spares without
// the store; a composed request that another zone denies puts the spare
// back; Close gives unused spares back to the store.
func TestPrefetchAdmitsFromSpares(t *testing.T) {
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	cs := &countingStore{Store: ms}
	l := New(cs, Options{})
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Hour, Burst: 100, Prefetch: 10})
	strict := mustConfig(t, RuleConfig{Name: "strict", Rate: 1, Per: time.Hour, Burst: 1})
	one := []Request{{Rule: pf, Key: "k", Cost: 1}}
	res := make([]Result, 1)
	if out := l.Decide(context.Background(), one, res); out != Allowed || res[0].Remaining != 99 {
		t.Fatalf("first decision: %v %+v, want allowed with 99 remaining (90 in the store, 9 spares)", out, res[0])
	}
	for i := range 9 {
		if out := l.Decide(context.Background(), one, res); out != Allowed || res[0].Remaining != int64(98-i) {
			t.Fatalf("spare %d: %v %+v", i, out, res[0])
		}
	}
	if got := cs.calls.Load(); got != 1 {
		t.Fatalf("10 decisions made %d store calls, want 1 (9 from spares)", got)
	}
	// A request of pf and strict: strict admits once (store), pf from the
	// store again (spares are spent) and takes 8 more (a quarter of 89,
	// max 9); then strict denies, and pf's spare goes back.
	two := []Request{{Rule: pf, Key: "k", Cost: 1}, {Rule: strict, Key: "k", Cost: 1}}
	res2 := make([]Result, 2)
	if out := l.Decide(context.Background(), two, res2); out != Allowed {
		t.Fatalf("composed: %v %+v", out, res2)
	}
	st := l.PrefetchStats(pf)
	hits, taken := st.Hits, st.Taken
	if out := l.Decide(context.Background(), two, res2); out != Denied || !res2[0].Unknown || res2[1].Allowed {
		t.Fatalf("composed, strict empty: %v %+v, want denied by strict, pf unknown", out, res2)
	}
	st2 := l.PrefetchStats(pf)
	h2, t2 := st2.Hits, st2.Taken
	if h2 != hits || t2 != taken {
		t.Fatalf("a denied request changed the prefetch stats: hits %d→%d, taken %d→%d", hits, h2, taken, t2)
	}
	// The spare is still there: pf alone is admitted without the store.
	calls := cs.calls.Load()
	if out := l.Decide(context.Background(), one, res); out != Allowed || cs.calls.Load() != calls {
		t.Fatalf("after the put-back: %v, store calls %d→%d, want admitted from spares", out, calls, cs.calls.Load())
	}
	// Close returns the rest: the store's bucket then holds all but what
	// was admitted (10 + 1 + 1 = 12 admitted by pf).
	l.Close()
	check := make([]Result, 1)
	if _, err := ms.Decide(context.Background(), []Request{{Rule: pf, Key: "k"}}, check); err != nil {
		t.Fatal(err)
	}
	if check[0].Remaining != 88 {
		t.Fatalf("after Close the bucket holds %d, want 88 (100 less the 12 admitted)", check[0].Remaining)
	}
}

// TestPrefetchSparesExpire: spares a node does not use go back after the
// hold.
func TestPrefetchSparesExpire(t *testing.T) {
	ms := NewMemoryStore(MemoryOptions{Sweep: time.Hour})
	defer ms.Close()
	l := New(ms, Options{})
	defer l.Close()
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Hour, Burst: 100, Prefetch: 20, PrefetchHold: 50 * time.Millisecond})
	res := make([]Result, 1)
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, res); out != Allowed {
		t.Fatal(out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		check := make([]Result, 1)
		if _, err := ms.Decide(context.Background(), []Request{{Rule: pf, Key: "k"}}, check); err != nil {
			t.Fatal(err)
		}
		if check[0].Remaining == 99 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bucket still holds %d 10s after a 50ms hold, want 99", check[0].Remaining)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if returned := l.PrefetchStats(pf).Returned; returned != 19 {
		t.Fatalf("%d spares returned, want 19", returned)
	}
}

// TestPrefetchPause: a decision that took fewer spares than a full bucket
// gives it pauses its node for the time the rate takes to refill what it
// missed, never longer than the bucket takes to fill up, nor half the hold.
func TestPrefetchPause(t *testing.T) {
	r := mustConfig(t, RuleConfig{Name: "pf", Rate: 2000, Per: time.Second, Burst: 200, Prefetch: 20})
	slow := mustConfig(t, RuleConfig{Name: "slow", Rate: 100, Per: time.Second, Burst: 200, Prefetch: 20})
	small := mustConfig(t, RuleConfig{Name: "small", Rate: 10, Per: time.Second, Burst: 9, Prefetch: 6})
	for _, c := range []struct {
		rule              *Rule
		spares, remaining int64
		want              time.Duration
	}{
		{rule: small, spares: 2, remaining: 8, want: 0},                     // all of ⌊(9 − 1)/4⌋ a full bucket gives
		{rule: small, spares: 1, remaining: 6, want: 50 * time.Millisecond}, // one missed: 100ms, half the hold
		{rule: r, spares: 19, remaining: 100, want: 0},                      // all it wanted
		{rule: r, spares: 9, remaining: 50, want: 5 * time.Millisecond},     // 10 missed
		{rule: r, spares: 0, remaining: 0, want: 9500 * time.Microsecond},   // 19 missed
		{rule: slow, spares: 0, remaining: 0, want: 50 * time.Millisecond},  // half the hold
		{rule: r, spares: 0, remaining: 195, want: 2500 * time.Microsecond}, // the bucket is full in 2.5ms
		{rule: r, spares: 2, remaining: 200 + 2, want: 0},                   // full already
	} {
		q := &Request{Rule: c.rule, Key: "k", Cost: 1}
		res := &Result{Allowed: true, spares: c.spares, Remaining: c.remaining}
		if got := c.rule.pauseAfter(q, res); got != c.want {
			t.Errorf("%s: %d spares, %d remaining: pause %s, want %s", c.rule.name, c.spares, c.remaining, got, c.want)
		}
	}
}

// TestPrefetchOneCallInFlight: requests of one key that a node's spares do
// not cover while the node asks the store about the key wait for that
// answer and take its spares, instead of asking the store each.
func TestPrefetchOneCallInFlight(t *testing.T) {
	ms := newMemory(t, newTestClock(epoch))
	cs := &countingStore{Store: ms, delay: 50 * time.Millisecond}
	l := New(cs, Options{})
	defer l.Close()
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Hour, Burst: 1000, Prefetch: 20, PrefetchHold: time.Minute})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 15 {
		wg.Go(func() {
			res := make([]Result, 1)
			if l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, res) == Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 15 || cs.calls.Load() != 1 {
		t.Fatalf("15 concurrent requests: %d admitted with %d store calls, want 15 with 1 (19 spares)", admitted.Load(), cs.calls.Load())
	}
	if st := l.PrefetchStats(pf); st.Hits != 14 || st.Decisions != 1 || st.Taken != 19 {
		t.Fatalf("prefetch stats %+v, want 14 hits of 1 decision taking 19", st)
	}
}

// TestPrefetchPauseEndsWithTheWindow: a fixed window is full again when its
// window ends, so a pause never outlasts it. A decision 20 ms before the
// end of a 10 s window of 24 finds it nearly spent and takes fewer spares
// than it wanted (a pause of over a second by the rate); 60 ms later the
// window has rolled over, and the key's next request is decided by the
// store and admitted, not denied by a pause the new window does not call
// for.
func TestPrefetchPauseEndsWithTheWindow(t *testing.T) {
	clk := newTestClock(epoch + 10_000_000 - 20_000) // epoch is a window's start
	ms := newMemory(t, clk)
	l := New(ms, Options{})
	t.Cleanup(l.Close)
	fw := mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 24, Per: 10 * time.Second,
		Prefetch: 6, PrefetchHold: 4 * time.Second})
	one := []Request{{Rule: fw, Key: "k", Cost: 1}}
	res := make([]Result, 1)
	// Another node's decisions spent 15 of the window.
	if ok, err := ms.Decide(context.Background(), []Request{{Rule: fw, Key: "k", Cost: 15}}, res); err != nil || !ok {
		t.Fatalf("15 of the window: %v %v", ok, err)
	}
	if out := l.Decide(context.Background(), one, res); out != Allowed || res[0].spares >= 5 {
		t.Fatalf("a decision near the window's end: %v with %d spares, want allowed with fewer than 5", out, res[0].spares)
	}
	clk.add(60_000)
	time.Sleep(60 * time.Millisecond) // the spares' hold ended with their window
	if out := l.Decide(context.Background(), one, res); out != Allowed {
		t.Fatalf("the first request of the next window: %v %+v, want allowed (the window holds nothing)", out, res[0])
	}
}

// TestPrefetchRefundedKeyNotPaced: a bucket whose burst, less a request's
// cost, holds fewer than 4 tokens gives no decision a spare, full or not,
// so a decision that takes none is all its rule allows and no sign that
// the key runs low. Two nodes on one Redis, a zone of 10/s, burst 5, cost
// 2 and prefetch 6, and a key whose every charge is refunded (count_status)
// as soon as it is decided: every request finds the bucket full, and is
// admitted, also one that comes right after its node's last decision. A
// node paced the key after each of its decisions, and denied the next one
// without the store (seed 330014 of the chaos checker).
func TestPrefetchRefundedKeyNotPaced(t *testing.T) {
	addr := redistest.Start(t).Addr
	nodes := []*Limiter{New(newRedisStore(t, RedisOptions{Address: addr}), Options{}),
		New(newRedisStore(t, RedisOptions{Address: addr}), Options{})}
	for _, l := range nodes {
		t.Cleanup(l.Close)
	}
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 10, Per: time.Second, Burst: 5, Prefetch: 6, Refunds: true})
	// The chaos client's order of nodes, 5 ms apart.
	for i, n := range []int{0, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1} {
		reqs := []Request{{Rule: pf, Key: "refunded", Cost: 2}}
		res := make([]Result, 1)
		if out := nodes[n].Decide(context.Background(), reqs, res); out != Allowed {
			t.Fatalf("request %d on node %d: %v %+v, want admitted (every charge refunded, the bucket full)", i, n, out, res[0])
		}
		if err := nodes[n].Refund(context.Background(), Allowed, reqs, res); err != nil {
			t.Fatalf("refund %d: %v", i, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
