package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestConcurrencyClusterAbortDuringDecision: on a Redis Cluster, a request
// whose client goes away while its decision is in Redis must not keep a
// slot. The request has two zones (a concurrency zone and a rate zone),
// so its decision takes the Cluster's per-slot path. The slot's master
// holds writes (CLIENT PAUSE WRITE) while the decision waits there; the
// client leaves, and then Redis runs the decision. A node that gave up on
// the decision when the client left (499) never learns that Redis took a
// slot for it, so nobody releases that slot: with limit 1 and a 5-minute
// lease, the key is denied for 5 minutes. What the test wants: the key
// admits a fresh request within 5 s.
func TestConcurrencyClusterAbortDuringDecision(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	n := startCaddy(t, "debug", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 20s
		}
		zone inflight {
			algorithm concurrency
			key {header.X-Key}
			limit 1
			lease 5m
		}
		zone api {
			key {header.X-Key}
			rate 1000 1s
		}
	}
	respond "ok"`, strings.Join(c.Addrs(), " ")))
	const key = "leaver"
	master := c.NodeForSlot(c.KeySlot(key))

	// The node is connected to the key's master, its script loaded, and
	// the warm-up's slot is released (the key's set is gone).
	if r := n.get("/", "X-Key: "+key); r.Status != http.StatusOK {
		t.Fatalf("warm-up: status %d, want 200", r.Status)
	}
	waitFor(t, 10*time.Second, "the warm-up's slot to be released", func() bool {
		return master.MustDo("EVAL", "return #redis.call('KEYS', '*inflight*')", "0") == "0"
	})

	master.MustDo("CLIENT", "PAUSE", "30000", "WRITE")
	t.Cleanup(func() { _, _ = master.Do("CLIENT", "UNPAUSE") })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := getLimited(ctx, holdClient, n.URL+"/", "X-Key: "+key)
		done <- err
	}()
	// The decision is in Redis, held by the pause.
	waitFor(t, 10*time.Second, "the decision to wait in Redis", func() bool {
		for _, line := range strings.Split(master.MustDo("CLIENT", "LIST"), "\n") {
			if strings.Contains(line, "cmd=evalsha") && strings.Contains(line, "flags=b") {
				return true
			}
		}
		return false
	})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request was answered while its decision was held in Redis")
	}
	// Give Caddy the time to give up on the request: a node that
	// abandons a decision when its client leaves logs a 499 (its error
	// log, at debug level) at once; a node that waits for Redis whatever
	// the client does logs nothing, and the test goes on after 2 s.
	gaveUp := pollUntil(2*time.Second, func() bool { return strings.Contains(n.log.String(), `"status":499`) })
	t.Logf("the node answered 499 while the decision was held in Redis: %v", gaveUp)
	master.MustDo("CLIENT", "UNPAUSE")

	var last string
	ok := pollUntil(5*time.Second, func() bool {
		r := n.get("/", "X-Key: "+key)
		last = fmt.Sprintf("status %d, RateLimit %q", r.Status, r.Header.Get("Ratelimit"))
		return r.Status == http.StatusOK
	})
	if !ok {
		t.Errorf("5 s after a client left while its decision was in Redis, the key is still denied (%s): the decision took a slot in Redis that nobody releases (it ends with its lease, 5m)", last)
	}
}

// waitFor polls cond every 20 ms until it holds, and fails the test with
// what after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// pollUntil polls cond every 20 ms until it holds (true) or timeout passes
// (false).
func pollUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
