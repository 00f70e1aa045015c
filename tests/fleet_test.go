package tests

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// startFleet starts count Caddy nodes with one site configuration.
func startFleet(t *testing.T, count int, site string, env ...string) []*localfleet.Node {
	t.Helper()
	nodes := make([]*localfleet.Node, count)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i] = localfleet.StartNode(t, caddyBin, "", site, env...)
		}()
	}
	wg.Wait()
	return nodes
}

// redisBlock points a fleet at r. The timeout is generous: these tests
// measure exactness on a machine that also runs the load generator, Redis
// and every node, where a decision can wait longer than the default 25ms
// for a CPU; a request that failed open would make the bound uncheckable.
func redisBlock(r *redistest.Server) string {
	return fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t\ttimeout 2s\n\t\t}", r.Addr)
}

// TestFleetExactness is the product's promise: three Caddy nodes sharing
// one Redis admit, for every bucket, no more than burst + rate x elapsed,
// and no less than 98% of it while demand exceeds supply.
func TestFleetExactness(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := localfleet.Exactness(redisBlock(r))
	nodes := startFleet(t, 3, sc.Site)
	rep := localfleet.Run(context.Background(), localfleet.Load{Nodes: nodes, Targets: sc.Targets, Connections: 60, Duration: 10 * time.Second})
	t.Logf("3 nodes, 60 connections, %s:\n%s\n%s", rep.Duration.Round(time.Millisecond), rep.Table(), rep.DeniedTable(sc.Targets))
	for _, bad := range rep.Check() {
		t.Error(bad)
	}
	// Every node took part in every bucket.
	for _, bs := range rep.Buckets {
		for i, v := range bs.PerNode {
			if v == 0 {
				t.Errorf("%s/%s: node %d admitted nothing", bs.Bucket.Zone, bs.Bucket.Key, i+1)
			}
		}
	}
	// A request denied by the global zone is charged to no user zone: the
	// users' own zones have room to spare, so they deny (next to) nothing,
	// though the global zone denies most requests.
	var gRequests, gUserDenied, gAllDenied int64
	for t, s := range rep.Targets {
		if strings.HasPrefix(t.Name, "g") {
			gRequests += s.Requests
			gUserDenied += s.DeniedBy["g_user"]
			gAllDenied += s.DeniedBy["g_all"]
		}
	}
	t.Logf("composed zones: %d requests, %d denied by g_all, %d by g_user", gRequests, gAllDenied, gUserDenied)
	if gAllDenied < gRequests/2 {
		t.Errorf("the global zone denied only %d of %d requests: the load did not saturate it", gAllDenied, gRequests)
	}
	if gUserDenied*100 > gRequests {
		t.Errorf("user zones denied %d of %d requests: denials by the global zone were charged to them", gUserDenied, gRequests)
	}
}

// scriptCalls returns the EVALSHA calls r has run (localfleet.ScriptCalls).
func scriptCalls(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	n, err := localfleet.ScriptCalls(r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFleetDenyCache floods one key from every node: each node answers the
// flood from its deny cache, asking Redis about once per refill interval,
// and the fleet still admits exactly the bound.
func TestFleetDenyCache(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	sc := localfleet.Flood(redisBlock(r))
	nodes := startFleet(t, 3, sc.Site)
	before := scriptCalls(t, r)
	const d = 5 * time.Second
	rep := localfleet.Run(context.Background(), localfleet.Load{Nodes: nodes, Targets: sc.Targets, Connections: 30, Duration: d})
	calls := scriptCalls(t, r) - before
	s := rep.Targets[sc.Targets[0]]
	t.Logf("flood: %d requests, %d admitted, %d script calls in Redis\n%s", s.Requests, s.Admitted, calls, rep.Table())
	for _, bad := range rep.Check() {
		t.Error(bad)
	}
	// A token every 500 ms: 10 in 5 s, plus the burst of 2. Each node may
	// ask once per token and, because it learns a bucket's state as of
	// when it sent its request, once or twice more when it asks a moment
	// before the token is back.
	intervals := int64(d/(500*time.Millisecond)) + 1
	limit := int64(len(nodes)) * 4 * intervals
	perInterval := float64(calls) / float64(len(nodes)) / float64(intervals)
	t.Logf("script calls per node per refill interval: %.2f (limit %d calls in all)", perInterval, limit)
	if calls > limit {
		t.Errorf("%d script calls for a flood of %d requests: the deny cache should have kept it near one per node per interval (at most %d)", calls, s.Requests, limit)
	}
	if s.Requests < 20*calls {
		t.Errorf("only %d requests for %d script calls: the flood was too small to show anything", s.Requests, calls)
	}
}

var connectedClients = regexp.MustCompile(`connected_clients:(\d+)`)

func redisClients(t *testing.T, r *redistest.Server) int {
	t.Helper()
	m := connectedClients.FindStringSubmatch(r.MustDo("INFO", "clients"))
	if m == nil {
		t.Fatal("no connected_clients in INFO clients")
	}
	n, _ := strconv.Atoi(m[1])
	return n - 1 // this connection
}

// TestFleetReloadUnderLoad reloads every node ten times while the fleet is
// loaded, alternating two configurations with different limits: no request
// fails, Redis connections do not pile up, bucket state survives, and the
// new limit governs afterwards.
func TestFleetReloadUnderLoad(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	site := func(rate int) string {
		return fmt.Sprintf(`
	rate_limit {
		%s
		zone r {
			key {header.X-Key}
			rate %d 1s
			burst 20
		}
	}
	respond "ok"
	handle_errors 429 {
		respond "{http.rate_limit.exceeded.name}" 429
	}`, redisBlock(r), rate)
	}
	slow, fast := site(20), site(60)
	nodes := startFleet(t, 3, slow)
	b := &localfleet.Bucket{Zone: "r", Key: "k", Rate: 60, Per: time.Second, Burst: 20}
	targets := []*localfleet.Target{{Name: "k", Path: "/", Headers: []string{"X-Key: k"}, Cost: 1, Buckets: []*localfleet.Bucket{b}}}

	// The load runs until a second after the tenth round (a busy machine
	// reloads slower than one round per 400 ms), 60 s at the most.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rr := &reloadRounds{t: t, r: r, nodes: nodes, slow: slow, fast: fast, done: cancel}
	rep := localfleet.Run(ctx, localfleet.Load{
		Nodes: nodes, Targets: targets, Connections: 30, Duration: time.Minute, During: rr.during,
	})
	rounds, clients, reloadErrs := rr.rounds, rr.clients, rr.errs
	for _, err := range reloadErrs {
		t.Error(err)
	}
	s := rep.Targets[targets[0]]
	t.Logf("%d rounds of reloads of %d nodes under load: %d requests, %d admitted, %d retried on a fresh connection after the node closed an idle one, errors %v; redis clients after each round: %v\n%s",
		rounds, len(nodes), s.Requests, s.Admitted, s.Retried, s.ErrorKinds, clients, rep.Table())
	if rounds != 10 {
		t.Errorf("only %d rounds of reloads happened", rounds)
	}
	// No request failed, and the state survived every reload: a bucket
	// that restarted full on each reload would hand out its burst of 20
	// again each time, 600 tokens beyond the bound.
	for _, bad := range rep.Check() {
		t.Error(bad)
	}
	checkPoolsReused(t, clients, len(nodes))
	checkNewLimitGoverns(t, nodes, targets)
}

// reloadRounds reloads every node at once, a round every 400 ms from
// 0.5 s on, alternating slow and fast; the last round (the tenth) leaves
// the fast one, and a second later it calls done. After each round it
// counts Redis' clients.
type reloadRounds struct {
	t          *testing.T
	r          *redistest.Server
	nodes      []*localfleet.Node
	slow, fast string
	done       func()
	rounds     int
	clients    []int   // Redis' clients after each round
	errs       []error // of the reloads
}

// during is the load's During hook.
func (rr *reloadRounds) during(elapsed time.Duration) {
	if rr.rounds >= 10 || elapsed < 500*time.Millisecond+time.Duration(rr.rounds)*400*time.Millisecond {
		return
	}
	cfg := rr.slow
	if rr.rounds%2 == 1 {
		cfg = rr.fast
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range rr.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.Reload("", cfg); err != nil {
				mu.Lock()
				rr.errs = append(rr.errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	rr.rounds++
	rr.clients = append(rr.clients, redisClients(rr.t, rr.r))
	if rr.rounds == 10 {
		time.AfterFunc(time.Second, rr.done)
	}
}

// checkPoolsReused: each node's pools open connections as the load needs
// them and reloads reuse them, so Redis' clients after each round
// (clients) level off.
func checkPoolsReused(t *testing.T, clients []int, nodes int) {
	t.Helper()
	// Each node's pools open connections as the load needs them, up to
	// 6 for pipelines and 6 for other commands (4 pipelines and 2 spare),
	// and reloads reuse them: the count levels off while the pools warm
	// up, and stays there. A reload that leaked its pool would add a
	// node's connections every round.
	for i, c := range clients {
		if c > 12*nodes {
			t.Errorf("round %d: %d redis connections for %d nodes: pools were not reused across reloads", i+1, c, nodes)
		}
	}
	if len(clients) == 10 && clients[9] > clients[4]+nodes {
		t.Errorf("redis connections kept growing with the reloads: %v", clients)
	}
}

// checkNewLimitGoverns: the last configuration (60 per second) governs
// after the reloads.
func checkNewLimitGoverns(t *testing.T, nodes []*localfleet.Node, targets []*localfleet.Target) {
	t.Helper()
	// The last configuration (60 per second) governs now: under full load
	// for 2 s the fleet admits about 120, which 20 per second could not.
	rep := localfleet.Run(context.Background(), localfleet.Load{Nodes: nodes, Targets: targets, Connections: 30, Duration: 2 * time.Second})
	s := rep.Targets[targets[0]]
	t.Logf("after the reloads (60/s): %d admitted in %s", s.Tokens, rep.Duration.Round(time.Millisecond))
	for _, bad := range rep.Check() {
		t.Error(bad)
	}
	if s.Tokens < 20+int64(20*rep.Duration.Seconds())+20 {
		t.Errorf("after reloading to 60/s the fleet admitted only %d tokens in %s: the old limit still governs", s.Tokens, rep.Duration)
	}
}

// TestFleetClockSkew runs a fleet in which one node's clock is an hour
// ahead and another's an hour behind (a test build hook shifts the nodes'
// time source): bucket time is Redis TIME, so the totals still meet the
// exact bound. A limiter that stamped time on the node would hand the
// node that is ahead a full bucket on every request.
func TestFleetClockSkew(t *testing.T) {
	t.Parallel()
	skewed := skewedCaddy(t)
	r := redistest.Start(t)
	sc := localfleet.Exactness(redisBlock(r))
	var nodes [3]*localfleet.Node
	var wg sync.WaitGroup
	for i, bin := range []string{skewed, skewed, caddyBin} {
		env := []string{"FLEETLIMIT_CLOCK_SKEW=" + []string{"1h", "-1h", "0s"}[i]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i] = localfleet.StartNode(t, bin, "", sc.Site, env...)
		}()
	}
	wg.Wait()
	for i, want := range []string{"shifted by 1h0m0s", "shifted by -1h0m0s"} {
		if !strings.Contains(nodes[i].Log.String(), want) {
			t.Fatalf("node %d does not run with its clock skewed (%q not in its output)", i+1, want)
		}
	}
	rep := localfleet.Run(context.Background(), localfleet.Load{Nodes: nodes[:], Targets: sc.Targets, Connections: 60, Duration: 6 * time.Second})
	t.Logf("node clocks +1h, -1h, exact; 60 connections, %s:\n%s", rep.Duration.Round(time.Millisecond), rep.Table())
	for _, bad := range rep.Check() {
		t.Error(bad)
	}
}
