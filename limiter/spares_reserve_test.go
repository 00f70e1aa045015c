package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestPrefetchSparesRespectReserve: a request admitted from the node's
// spares leaves the zone its reserve, as one decided by the store does: a
// class with reserve 80 stops where the zone (its bucket and the node's
// unused spares) would keep less than 80 of 100.
func TestPrefetchSparesRespectReserve(t *testing.T) {
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	l := New(ms, Options{})
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Hour, Burst: 100, Prefetch: 40})
	res := make([]Result, 1)
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, res); out != Allowed || res[0].spares == 0 {
		t.Fatalf("first decision: %v %+v, want admitted with spares", out, res[0])
	}
	admitted := 1
	for range 40 {
		if l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1, Reserve: 80}}, res) != Allowed {
			break
		}
		admitted++
	}
	l.Close() // the unused spares go back
	check := make([]Result, 1)
	if _, err := ms.Decide(context.Background(), []Request{{Rule: pf, Key: "k"}}, check); err != nil {
		t.Fatal(err)
	}
	if check[0].Remaining < 80 || check[0].Remaining+int64(admitted) != 100 {
		t.Fatalf("reserve 80 admitted %d in all, and the bucket holds %d: want at least 80 kept", admitted, check[0].Remaining)
	}
}

// TestPrefetchPacingSparesCoveredClasses: a shed of a class with a reserve
// paces the key, but a class whose reserve the bucket still covers (the
// critical one, reserve 0) is still decided, and admitted; an empty bucket
// still paces everyone.
func TestPrefetchPacingSparesCoveredClasses(t *testing.T) {
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	l := New(ms, Options{})
	defer l.Close()
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Hour, Burst: 100, Prefetch: 10, PrefetchHold: time.Minute})
	if ok, _ := decideOne(t, ms, pf, "k", 60); !ok { // 40 left
		t.Fatal("could not spend 60 of 100")
	}
	res := make([]Result, 1)
	// Another key's spares start the node's holder of spares.
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "warm", Cost: 1}}, res); out != Allowed || l.spares.Load() == nil {
		t.Fatalf("warming: %v %+v, want admitted with spares", out, res[0])
	}
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1, Reserve: 50}}, res); out != Denied {
		t.Fatalf("reserve 50 with 40 left: %v %+v, want shed", out, res[0])
	}
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, res); out != Allowed {
		t.Fatalf("reserve 0 right after the shed, 40 left: %v %+v, want admitted (paced by another class's shed)", out, res[0])
	}
	// Empty the bucket: the key is paced for everyone.
	if ok, _ := decideOne(t, ms, pf, "k", res[0].Remaining-res[0].spares); !ok {
		t.Fatal("could not empty the bucket")
	}
	for range 20 {
		l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, res)
	}
	if _, paced, _ := l.spares.Load().take([]Request{{Rule: pf, Key: "k", Cost: 1}}, make([]Result, 1), make([]bool, 1), time.Now(), &spareFlight{}); !paced {
		t.Fatal("an empty bucket does not pace the key")
	}
}

// TestPrefetchAfterClose: a decision made after Close (a request still in
// flight while its configuration unloads) starts no holder of spares,
// whose sweeper nobody would stop: its spares go straight back.
func TestPrefetchAfterClose(t *testing.T) {
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	l := New(ms, Options{})
	l.Close()
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 1, Per: time.Hour, Burst: 100, Prefetch: 10})
	res := make([]Result, 1)
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}}, res); out != Allowed {
		t.Fatalf("after Close: %v", out)
	}
	if l.spares.Load() != nil {
		t.Fatal("a decision after Close started a holder of spares (and its sweeper)")
	}
	if _, check := decideOne(t, ms, pf, "k", 0); check.Remaining != 99 {
		t.Fatalf("the bucket holds %d after one request, want 99: the spares did not go back", check.Remaining)
	}
}

// TestPrefetchSpareRefundedInItsWindow: a fixed window gives a refund
// back only in the window that counted the charge, which the refund names
// by the charge's time. A request admitted from the node's spares carries
// the time of the prefetch that took them, so that its refund (count_status,
// a denial by another zone) gives the charge back; it carried none, and a
// count_status client's refunds of spare-admitted requests were lost.
func TestPrefetchSpareRefundedInItsWindow(t *testing.T) {
	for _, name := range []string{"memory", "redis"} {
		t.Run(name, func(t *testing.T) {
			var store Store
			if name == "memory" {
				store = newMemory(t, newTestClock(epoch))
			} else {
				store = newRedisStore(t, RedisOptions{Address: redistest.Start(t).Addr})
			}
			l := New(store, Options{})
			defer l.Close()
			fw := mustConfig(t, RuleConfig{Name: "fw", Algorithm: FixedWindow, Rate: 100, Per: time.Hour, Prefetch: 5, PrefetchHold: time.Minute})
			admit := func() []Result {
				res := make([]Result, 1)
				if out := l.Decide(context.Background(), []Request{{Rule: fw, Key: "k", Cost: 1}}, res); out != Allowed {
					t.Fatalf("decision: %v %+v, want admitted", out, res[0])
				}
				return res
			}
			if first := admit(); first[0].spares == 0 {
				t.Fatalf("the first decision took no spares: %+v", first[0])
			}
			fromSpares := admit()
			if hits := l.PrefetchStats(fw).Hits; hits != 1 {
				t.Fatalf("%d requests admitted from spares, want 1", hits)
			}
			if err := l.Refund(context.Background(), Allowed, []Request{{Rule: fw, Key: "k", Cost: 1}}, fromSpares); err != nil {
				t.Fatal(err)
			}
			l.Close() // the unused spares go back
			check := make([]Result, 1)
			if _, err := store.Decide(context.Background(), []Request{{Rule: fw, Key: "k"}}, check); err != nil {
				t.Fatal(err)
			}
			// Two admitted, one refunded, the spares refunded: one used.
			if check[0].Remaining != 99 {
				t.Fatalf("the window has %d left after two admitted and one refunded, want 99: the refund of the request admitted from spares was lost", check[0].Remaining)
			}
		})
	}
}

// TestPrefetchNotPacedByAnotherZonesDenial: a request that another zone
// denied takes no spares from a prefetching zone that would have admitted
// it; that is no sign that the zone's bucket runs low, and must not pace
// its key (which denied the key's next requests in the prefetching zone's
// name, its bucket full).
func TestPrefetchNotPacedByAnotherZonesDenial(t *testing.T) {
	clk := newTestClock(epoch)
	ms := newMemory(t, clk)
	l := New(ms, Options{})
	defer l.Close()
	pf := mustConfig(t, RuleConfig{Name: "pf", Rate: 16, Per: time.Second, Burst: 14, Prefetch: 6})
	tight := mustConfig(t, RuleConfig{Name: "tight", Rate: 100, Per: time.Second, Burst: 1})
	both := func() ([]Result, Outcome) {
		res := make([]Result, 2)
		out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "k", Cost: 1}, {Rule: tight, Key: "all", Cost: 1}}, res)
		return res, out
	}
	// Another key's spares start the node's holder of spares.
	if out := l.Decide(context.Background(), []Request{{Rule: pf, Key: "warm", Cost: 1}}, make([]Result, 1)); out != Allowed || l.spares.Load() == nil {
		t.Fatalf("warming: %v, want admitted with spares", out)
	}
	if _, out := both(); out != Allowed {
		t.Fatalf("first request: %v, want admitted", out)
	}
	for range 3 { // the spares cover pf; tight, empty, denies
		if res, out := both(); out != Denied || res[1].Allowed {
			t.Fatalf("tight drained: %v %+v, want denied by tight", out, res)
		}
	}
	l.spares.Load().expired(time.Time{}) // the spares gone: pf asks the store
	if res, out := both(); out != Denied || res[1].Allowed || !res[0].Allowed {
		t.Fatalf("tight drained, pf to the store: %v %+v, want denied by tight alone", out, res)
	}
	clk.add(20_000) // tight has a token again; pf never ran low
	if res, out := both(); out != Allowed {
		t.Fatalf("tight refilled, pf at %d of 14: %v %+v, want admitted", 14-2, out, res)
	}
}
