package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// requireRedis skips the test without redis-server and redis-cli, or fails
// it in CI (CI set), where .ci/run installs them.
func requireRedis(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is required by this test and is not on PATH (.ci/run installs it: apt-get install redis-server): %v", bin, err)
			}
			t.Skipf("%s is not on PATH (apt-get install redis-server); CI is not set, so this test is skipped", bin)
		}
	}
}

// TestFleetSimSmall runs a small simulation (10 nodes, 10,000 keys, 2 s)
// against a single Redis and a Cluster of three masters, with a global zone
// that the load saturates and per-client zones that its hot keys saturate,
// without and with a prefetch on the global zone, and checks that it
// completes and that no bucket admitted more than burst + rate x elapsed.
// It asserts no speed: the machine may be busy.
func TestFleetSimSmall(t *testing.T) {
	requireRedis(t)
	single := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	c := config{
		Nodes: 10, Workers: 2, Keys: 10_000, ZipfS: 1.1, Duration: 2 * time.Second,
		Global: true, Client: true,
		GlobalLimit: limit{rate: 1000, burst: 200},
		ClientLimit: limit{rate: 5, burst: 10},
		Timeout:     5 * time.Second, Pipelines: 1, Seed: 7,
	}
	cases := []struct {
		name     string
		target   target
		prefetch int64
	}{
		{"single", target{name: "single", addrs: []string{single.Addr}}, 0},
		{"cluster", target{name: "cluster", addrs: cluster.Addrs(), cluster: true}, 0},
		{"single prefetch", target{name: "single", addrs: []string{single.Addr}}, 16},
		{"cluster prefetch", target{name: "cluster", addrs: cluster.Addrs(), cluster: true}, 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := c
			c.GlobalPrefetch = tc.prefetch
			tg := tc.target
			r, err := simulate(ctx, c, tg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("\n%s\n%s", summaryTable([]*result{r}), classTable([]*result{r}))
			if tg.cluster {
				t.Logf("\n%s", masterTable([]*result{r}))
			}
			if r.Requests == 0 || r.StoreCalls == 0 || r.Admitted == 0 {
				t.Fatalf("the simulation decided nothing: %d requests, %d store calls, %d admitted", r.Requests, r.StoreCalls, r.Admitted)
			}
			if r.Redis.EvalshaCalls == 0 {
				t.Errorf("Redis counted no EVALSHA during the load, yet %d decisions reached it", r.StoreCalls)
			}
			if r.Global == nil || len(r.Classes) != 3 {
				t.Fatalf("want the global bucket and three classes of client keys, got %v and %d", r.Global, len(r.Classes))
			}
			for _, cl := range append(r.Classes, *r.Global) {
				if cl.Over != 0 || cl.Excess != 0 {
					t.Errorf("%s: %d keys admitted %d tokens above burst + rate x elapsed", cl.Name, cl.Over, cl.Excess)
				}
				if cl.Admitted > cl.Eligible || cl.Eligible > cl.Offered {
					t.Errorf("%s: admitted %d, eligible %d, offered %d: counts out of order", cl.Name, cl.Admitted, cl.Eligible, cl.Offered)
				}
			}
			var admitted int64
			for _, cl := range r.Classes {
				admitted += cl.Admitted
			}
			if admitted != r.Admitted || r.Global.Admitted != r.Admitted {
				t.Errorf("admitted %d requests, but the client keys count %d and the global bucket %d", r.Admitted, admitted, r.Global.Admitted)
			}
		})
	}
}

// TestLedgerBound: a key admitted more than burst + rate x elapsed is
// counted over its bound, by the excess; one at its bound is not.
func TestLedgerBound(t *testing.T) {
	l := limit{rate: 10, burst: 20}
	var c classResult
	// 1.5 s: bound 35.
	c.add(100, 100, 35, 0, 1_500_000_000, l)
	if c.Over != 0 || c.Reachable != 35 {
		t.Fatalf("at the bound: over %d, reachable %d; want 0 and 35", c.Over, c.Reachable)
	}
	c.add(100, 90, 37, 0, 1_500_000_000, l)
	if c.Over != 1 || c.Excess != 2 {
		t.Fatalf("2 above the bound: over %d keys by %d; want 1 key by 2", c.Over, c.Excess)
	}
	// Fewer eligible than the bound: reachable is what was eligible.
	c = classResult{}
	c.add(5, 3, 3, 0, 0, l)
	if c.Reachable != 3 || c.Ratio() != 1 {
		t.Fatalf("3 eligible, 3 admitted: reachable %d, ratio %v", c.Reachable, c.Ratio())
	}
}

// TestClasses: the ranks are split into hot, warm and cold without gaps.
func TestClasses(t *testing.T) {
	for _, keys := range []int{1, 2, 100, 10_000, 1_000_000} {
		cs := classes(keys)
		next := 0
		for _, c := range cs {
			if c.Lo != next || c.Hi <= c.Lo {
				t.Fatalf("%d keys: classes %+v leave a gap or are empty", keys, cs)
			}
			next = c.Hi
		}
		if next != keys {
			t.Fatalf("%d keys: classes %+v end at %d", keys, cs, next)
		}
	}
	if cs := classes(1_000_000); cs[0].Hi != 100 || cs[1].Hi != 10_000 {
		t.Fatalf("1,000,000 keys: hot and warm end at %d and %d, want 100 and 10,000", cs[0].Hi, cs[1].Hi)
	}
}
