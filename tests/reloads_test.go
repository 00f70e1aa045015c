package tests

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/chaos"
	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// reloadCount is how many times TestReloadHygiene reloads each node (a
// few in the suite; `-reloads 100` for the figures of a long run).
var reloadCount = flag.Int("reloads", 8, "reloads of each node in TestReloadHygiene")

// reloadSite is a site with every kind of background work a reload must
// stop: a Redis store with its workers, the ban channel and the idle probe,
// prefetch's sweeper, a concurrency zone, the fleet view and the feed.
const reloadSite = `
	rate_limit {
		redis {
			address %s
		}
		zone api {
			key {header.X-Key}
			rate %d 1s
			prefetch 10
		}
		zone slots {
			key {header.X-Key}
			algorithm concurrency
			limit 8
		}
		zone login {
			key {header.X-Key}
			rate 5 1m
			ban 10s after 3 in 1m
		}
	}
	respond "ok"`

// TestReloadHygiene reloads each node of a 3-node fleet many times under
// load, alternating two configurations: each node's goroutines, open file
// descriptors and resident memory come back to what they were after a
// first reload (within the checker's margins), and it logs both.
func TestReloadHygiene(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	nodes := make([]*localfleet.Node, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i] = localfleet.StartNode(t, caddyBin, "", fmt.Sprintf(reloadSite, r.Addr, 1000)) })
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var load sync.WaitGroup
	for c := range 6 {
		load.Go(func() {
			for i := 0; ctx.Err() == nil && i < 1_000_000; i++ {
				n := nodes[(c+i)%len(nodes)]
				_, _ = n.Do("GET", "/", fmt.Sprintf("X-Key: k%d", i%50))
			}
		})
	}
	reload := func(round int) {
		t.Helper()
		for _, n := range nodes {
			if err := n.Reload("", fmt.Sprintf(reloadSite, r.Addr, 1000+round%2)); err != nil {
				t.Fatalf("reload %d: %v", round, err)
			}
		}
	}
	reload(0)
	time.Sleep(2 * time.Second)
	base := make([]chaos.Usage, len(nodes))
	for i, n := range nodes {
		var err error
		if base[i], err = chaos.Measure(n); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for round := 1; round <= *reloadCount; round++ {
		reload(round)
	}
	took := time.Since(start)
	cancel()
	load.Wait()
	time.Sleep(3 * time.Second) // spares' holds, idle connections and leases settle
	for i, n := range nodes {
		after, err := chaos.Measure(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node %d, %d reloads under load in %s: before %s; after %s", i+1, *reloadCount, took.Round(time.Millisecond), base[i], after)
		if over := chaos.BackAt(base[i], after); over != "" {
			t.Errorf("node %d after %d reloads: %s", i+1, *reloadCount, over)
		}
	}
}
