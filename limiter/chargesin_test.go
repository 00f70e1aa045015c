package limiter

import (
	"context"
	"strings"
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
