package limiter

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// skewedBy returns this node's clock shifted by d.
func skewedBy(d time.Duration) Clock {
	return ClockFunc(func() time.Time { return time.Now().Add(d) })
}

// TestChargesInByRedisClock: the set of nodes whose charges are in is
// scored by Redis' clock, not by each node's. A node whose clock is 10 s
// behind is counted by the others, and a node 10 s ahead leaves no entry
// that outlives chargedWindow and ends a later outage's grace early.
func TestChargesInByRedisClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	right := newRedisStore(t, RedisOptions{Address: srv.Addr})
	behind := newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: skewedBy(-10 * time.Second)})
	ahead := newRedisStore(t, RedisOptions{Address: srv.Addr, Clock: skewedBy(10 * time.Second)})
	for _, s := range []*RedisStore{right, behind, ahead} {
		if _, err := s.ChargesIn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(chargedShared) // a new record, not the last one's count
	if n, err := right.ChargesIn(ctx); err != nil || n != 3 {
		t.Fatalf("the node with the right clock counts %d nodes (%v), want 3: a node 10 s behind or ahead is not counted", n, err)
	}
	if n, err := behind.ChargesIn(ctx); err != nil || n != 3 {
		t.Fatalf("the node 10 s behind counts %d nodes (%v), want 3", n, err)
	}

	// A later outage, chargedWindow after: only its own node counts.
	time.Sleep(chargedWindow + 500*time.Millisecond)
	later := newRedisStore(t, RedisOptions{Address: srv.Addr})
	if n, err := later.ChargesIn(ctx); err != nil || n != 1 {
		t.Fatalf("%s later a node counts %d nodes (%v), want 1: an entry of the last outage ends this one's grace early",
			chargedWindow+500*time.Millisecond, n, err)
	}
}

// TestChargesInACL: the barrier's script runs under the documented ACL
// line.
func TestChargesInACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.AddUser("barrier", "barrier-pw", strings.Fields(banACL)...)
	s := newRedisStore(t, RedisOptions{Address: srv.Addr, KeyPrefix: "acl:", Username: "barrier", Password: "barrier-pw"})
	if n, err := s.ChargesIn(context.Background()); err != nil || n != 1 {
		t.Fatalf("ChargesIn under the ACL: %d, %v", n, err)
	}
}

// TestChargingAnswersBounded: in a fleet of 100 nodes (each a limiter on a
// store of its own, on one real Redis), 50 come back from an outage with
// charges and announce it, twice. Each of the 50 idle nodes answers,
// adding itself to the set of nodes whose charges are in, once: 50 calls
// of the barrier, not one per announcement (5,000). Announcements within
// chargedAnswerEvery of its answer get none, since its entry still counts
// through their grace; a later one gets a fresh answer. The calls are
// counted by Redis (INFO commandstats: the barrier's one ZCARD each). On a
// machine so loaded that announcements go out seconds late, a node may
// answer again, but never twice within chargedAnswerEvery: that is the
// bound checked.
func TestChargingAnswersBounded(t *testing.T) {
	t.Parallel()
	const fleet, charging, idle = 100, 50, 50
	srv := redistest.Start(t)
	lims := make([]*Limiter, fleet)
	for i := range lims {
		s := newRedisStore(t, RedisOptions{Address: srv.Addr})
		lims[i] = New(s, Options{})
		t.Cleanup(lims[i].Close)
	}
	channel := lims[0].store.(*RedisStore).banChannel()
	waitFor(t, "every store subscribed", func() bool {
		return srv.MustDo("PUBSUB", "NUMSUB", channel) == channel+"\n"+strconv.Itoa(fleet)
	})
	for _, l := range lims[:charging] {
		l.out.mu.Lock()
		l.setPending(1) // a key's local admissions to charge
		l.out.mu.Unlock()
	}
	answers := func() int64 { return commandStats(srv)["zcard"].calls }
	announce := func() {
		for _, l := range lims[:charging] {
			l.announceCharging()
		}
	}
	srv.MustDo("CONFIG", "RESETSTAT")
	start := time.Now() // no answer was sent before
	// settle waits for at least least answers in all, and a little for
	// those still on their way, then checks them against the bound: each
	// idle node at most once per chargedAnswerEvery since start.
	settle := func(least int64, what string) (reached time.Time) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for answers() < least && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		reached = time.Now()
		time.Sleep(300 * time.Millisecond)
		got, span := answers(), time.Since(start)
		most := idle * (1 + int64(span/chargedAnswerEvery))
		t.Logf("%s: %d calls of the barrier in %s since the first announcement", what, got, span.Round(time.Millisecond))
		if got < least || got > most {
			t.Fatalf("%s: %d calls of the barrier in %s, want %d to %d", what, got, span.Round(time.Millisecond), least, most)
		}
		return reached
	}

	announce()
	announce() // the same nodes again: answered already, or being answered
	answered := settle(idle, "the idle nodes answer two rounds of announcements")
	time.Sleep(time.Until(answered.Add(chargedAnswerEvery))) // every answer was sent before answered
	announce()
	settle(2*idle, "announcements chargedAnswerEvery after the answers")
}

// TestChargesInShared: the limiters of one node that poll the barrier at
// once share its records, at most one per chargedShared; a poll
// chargedShared later sends another.
func TestChargesInShared(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newRedisStore(t, RedisOptions{Address: srv.Addr})
	srv.MustDo("CONFIG", "RESETSTAT")
	start := time.Now()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if n, err := s.ChargesIn(context.Background()); err != nil || n != 1 {
				t.Errorf("ChargesIn: %d, %v", n, err)
			}
		})
	}
	wg.Wait()
	// One record per chargedShared at most: one, unless this machine took
	// that long to start the goroutines.
	took := time.Since(start)
	if got, most := commandStats(srv)["zcard"].calls, 1+int64(took/chargedShared); got > most {
		t.Fatalf("20 polls in %s sent %d records, want at most %d", took, got, most)
	}
	before := commandStats(srv)["zcard"].calls
	time.Sleep(chargedShared)
	if _, err := s.ChargesIn(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := commandStats(srv)["zcard"].calls - before; got != 1 {
		t.Fatalf("a poll %s later sent %d records, want 1", chargedShared, got)
	}
}
