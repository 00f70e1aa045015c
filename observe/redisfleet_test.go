package observe

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestFleetCounters: reports from two nodes add up per second of Redis'
// clock, zones stay apart, the nodes are listed, and every key expires.
func TestFleetCounters(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := startRedisStats(t, limiter.RedisOptions{Address: r.Addr, KeyPrefix: "fl:"})
	ctx := context.Background()
	var a, b FleetReport
	a.Zone, a.Counts[limiter.Allowed], a.Counts[limiter.Denied] = "api", 5, 2
	b.Zone, b.Counts[limiter.Allowed], b.Counts[limiter.FailedOpen] = "api", 3, 1
	login := FleetReport{Zone: "login"}
	login.Counts[limiter.LocalDenied] = 4
	if n, err := s.fleetReport(ctx, "node-a", []FleetReport{a, login}); err != nil || n != 1 {
		t.Fatalf("first report: %d nodes, %v; want 1", n, err)
	}
	if n, err := s.fleetReport(ctx, "node-b", []FleetReport{b}); err != nil || n != 2 {
		t.Fatalf("second report: %d nodes, %v; want 2", n, err)
	}
	// The view ends two seconds before Redis' current second.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(2100 * time.Millisecond)))
	view, err := s.fleetRead(ctx, []string{"api", "login", "idle"}, 60)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(z string) (c [limiter.NumOutcomes]int64) {
		for _, sec := range view.Zones[z].Seconds {
			for o, n := range sec {
				c[o] += n
			}
		}
		return c
	}
	if got := sum("api"); got[limiter.Allowed] != 8 || got[limiter.Denied] != 2 || got[limiter.FailedOpen] != 1 || got[limiter.LocalDenied] != 0 {
		t.Errorf("api: %v", got)
	}
	if got := sum("login"); got[limiter.LocalDenied] != 4 || got[limiter.Allowed] != 0 {
		t.Errorf("login: %v", got)
	}
	if got := sum("idle"); got != ([limiter.NumOutcomes]int64{}) || len(view.Zones["idle"].Seconds) != 60 {
		t.Errorf("idle: %v over %d seconds", got, len(view.Zones["idle"].Seconds))
	}
	if n := view.Zones["api"].Nodes; len(n) != 2 || n[0] != "node-a" || n[1] != "node-b" {
		t.Errorf("api nodes %q", n)
	}
	if n := view.Zones["login"].Nodes; len(n) != 1 || n[0] != "node-a" {
		t.Errorf("login nodes %q", n)
	}
	for _, k := range strings.Split(r.MustDo("KEYS", "fl:*"), "\n") {
		if !strings.HasPrefix(k, "fl:fleet:{") || strings.HasSuffix(k, "}") {
			t.Errorf("key %q: want fl:fleet:{zone}:..., never ending in a brace like a bucket", k)
		}
		if ttl, _ := strconv.Atoi(r.MustDo("TTL", k)); ttl <= 0 {
			t.Errorf("%s has no TTL (%d)", k, ttl)
		}
	}
}
