package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// settle is how long the checker waits after the load before it looks at
// slots and resources: releases and refunds queued after the last
// responses, prefetched spares given back (100 ms by default).
const settle = 1500 * time.Millisecond

// Run runs scenario s over real processes (the Caddy binary bin, built from
// cmd/caddy, and the scenario's Redis) and checks its invariants. t owns
// the processes: they stop when it cleans up.
func Run(t redistest.T, bin string, s *Scenario) *Result {
	began := time.Now()
	f := startFleet(t, bin, s)
	obs, loadEnd := f.load(s)
	c := &checker{s: s, o: obs}
	res := &Result{Scenario: s}
	c.checkFaults(res)
	c.probeSlots(f.nodes, f.be, loadEnd)
	obs.seen, obs.peaks = f.up.snapshot()
	c.checkObserved(res, f.nodes)
	c.checkResources(f)
	res.Requests = len(obs.requests)
	for _, q := range obs.requests {
		if _, ok := obs.seen[q.id]; ok {
			res.Admitted++
		}
	}
	res.Tightest, res.Figures = c.tightest, c.figures
	res.Violations = summarize(c.out)
	res.Took = time.Since(began)
	return res
}

// fleet is a scenario's processes: its Redis, the upstream, the Caddy
// nodes, and each node's usage at the baseline.
type fleet struct {
	be    *backend
	up    *upstream
	nodes []*localfleet.Node
	base  []Usage
	// site writes a node's Caddyfile for the configuration's generation.
	site func(gen int) string
	// globals are each node's global options (its rate_limit_rls app, if
	// the scenario has an RLS client), rlsAddrs the app's addresses.
	globals, rlsAddrs []string
}

// startFleet starts the scenario's Redis, upstream and nodes, warms every
// node by a request and an admin call, and measures its baseline.
func startFleet(t redistest.T, bin string, s *Scenario) *fleet {
	f := &fleet{be: startBackend(t, s.Topology)}
	up, err := startUpstream(s.concurrencyZones, s.upstreamCosts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.close)
	f.up = up
	block := f.be.block()
	f.site = func(gen int) string { return s.Site(block, up.addr, gen) }
	f.globals, f.rlsAddrs = s.rlsGlobals(t, s.Nodes, block)

	f.nodes = make([]*localfleet.Node, s.Nodes)
	var wg sync.WaitGroup
	for i := range f.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.nodes[i] = localfleet.StartNode(t, bin, f.globals[i], f.site(0))
		}()
	}
	wg.Wait()

	f.base = make([]Usage, len(f.nodes))
	for _, n := range f.nodes {
		_, _ = n.Do(http.MethodGet, "/warm")
		_, _ = http.Get("http://" + n.Admin + "/rate_limit/stats")
	}
	time.Sleep(300 * time.Millisecond)
	for i, n := range f.nodes {
		if f.base[i], err = Measure(n); err != nil {
			t.Fatalf("node %d: measuring its baseline: %v", i, err)
		}
	}
	return f
}

// load runs the scenario's clients, its key resets and its faults at once,
// waits for what they left queued to settle, and returns what was observed
// (the upstream's side is read later) and when the load ended.
func (f *fleet) load(s *Scenario) (*observed, time.Time) {
	in := newInjector(s, f.be, f.nodes, rlsReload(f.nodes, f.globals, f.site))
	ctx, cancel := context.WithTimeout(context.Background(), s.Load)
	defer cancel()
	bansCtx, stopBans := context.WithCancel(context.Background())
	bans := watchBans(bansCtx, func() []string {
		var a []string
		for _, n := range f.nodes {
			a = append(a, n.Admin)
		}
		return a
	})
	var requests []*request
	loadDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(loadDone)
		requests = s.load(ctx, func(i int) string { return f.nodes[i].URL }, len(f.nodes))
	}()
	var rlsCalls []*request
	rlsDone := make(chan struct{})
	go func() {
		defer close(rlsDone)
		rlsCalls = s.runRLS(ctx, f.rlsAddrs)
	}()
	var resets []resetDone
	resetsDone := make(chan struct{})
	go func() {
		defer close(resetsDone)
		resets = s.injectResets(ctx, f.nodes, start)
	}()
	windows, skipped := in.run(start)
	<-loadDone
	<-rlsDone
	<-resetsDone
	loadEnd := time.Now()
	time.Sleep(settle)
	stopBans()
	return &observed{requests: requests, rlsCalls: rlsCalls, windows: windows, skipped: skipped, bans: bans.list(), resets: resets,
		settleLost: s.settlementsLost(f.nodes, settle)}, loadEnd
}

// checkFaults fails the run's harness invariant for every fault or key
// reset that could not be injected (a reset that failed in a Redis fault
// is that fault's doing), lists the faults in res, and the faults skipped
// in its figures.
func (c *checker) checkFaults(res *Result) {
	for _, r := range c.o.resets {
		if r.err != "" && !c.inFault(r.sent, r.done, 0, 0, c.redisDown) {
			c.fail(InvHarness, "key reset of zone %s at %s: %s", c.s.Zones[r.zone].Name, r.sent.Format("15:04:05.000"), r.err)
		}
	}
	for _, w := range c.o.windows {
		res.Faults = append(res.Faults, w.kind)
		if w.err != "" {
			c.fail(InvHarness, "%s at %s: %s", w.kind, w.start.Format("15:04:05.000"), w.err)
		}
	}
	res.Figures = append(res.Figures, c.o.skipped...)
}

// checkObserved checks what the clients and the upstream observed, and
// what the nodes' admin APIs say, against the scenario's invariants.
func (c *checker) checkObserved(res *Result, nodes []*localfleet.Node) {
	res.Buckets = c.checkBounds()
	res.Quotas = c.checkQuotas()
	c.checkInFlight()
	c.checkBans()
	c.checkIsolation()
	c.checkRefunds()
	c.checkDryRun()
	c.checkExempt()
	c.checkStatus()
	c.checkWaitRooms(nodes)
	c.checkSoftShed()
	c.checkShedRooms()
	c.countHangUps()
	c.checkRLS()
}

// checkResources checks that every node not killed during the run is back
// at its baseline's usage. The upstream first closes its idle keep-alive
// connections, so that the proxy's goroutines that wait on them are gone,
// as at the baseline.
func (c *checker) checkResources(f *fleet) {
	f.up.srv.SetKeepAlivesEnabled(false)
	time.Sleep(500 * time.Millisecond)
	for i, n := range f.nodes {
		after, err := Measure(n)
		switch {
		case err != nil:
			c.fail(InvResources, "node %d: %v", i, err)
		case after.pid != f.base[i].pid:
			// Killed and restarted: its baseline is gone.
		default:
			if over := BackAt(f.base[i], after); over != "" {
				c.fail(InvResources, "node %d after %d reloads: %s (baseline %s); most common goroutines: %s", i, reloads(c.o.windows), over, f.base[i], topGoroutines(n))
			}
		}
	}
}

// reloads counts the reloads among windows.
func reloads(windows []window) int {
	n := 0
	for _, w := range windows {
		if w.kind == FaultReload {
			n++
		}
	}
	return n
}

// concurrencyZones returns the concurrency zones that apply to path.
func (s *Scenario) concurrencyZones(path string) []*Zone {
	var out []*Zone
	for _, t := range s.Targets {
		if t.Path != path {
			continue
		}
		for _, zi := range t.Zones {
			if s.Zones[zi].Algorithm == Concurrency {
				out = append(out, s.Zones[zi])
			}
		}
	}
	return out
}

// maxProbeKeys bounds how many keys of a concurrency zone the slot probe
// tries.
const maxProbeKeys = 10

// probeSlots checks that no concurrency slot is held by nobody once the
// faults are over: for each concurrency zone and each key that used it,
// limit requests at once on the zone's probe path (no other zone applies)
// must all be admitted. A node killed during the load held slots that live
// until their lease ends: the probe waits for that.
func (c *checker) probeSlots(nodes []*localfleet.Node, be *backend, loadEnd time.Time) {
	at := loadEnd.Add(settle)
	for _, w := range c.o.windows {
		if w.kind == FaultNodeKill {
			for _, z := range c.s.Zones {
				if z.Algorithm == Concurrency {
					at = maxTime(at, w.start.Add(z.Lease+500*time.Millisecond))
				}
			}
		}
	}
	time.Sleep(time.Until(at))
	cl := &http.Client{Timeout: 10 * time.Second}
	for zi, z := range c.s.Zones {
		if z.Algorithm != Concurrency || z.DryRun {
			continue
		}
		// Every key of a client that keeps its key, and the last keys of
		// the rotating clients, up to maxProbeKeys.
		keys := map[string]bool{}
		var order, rotated []string
		for _, q := range c.o.requests {
			if hasZone(c.s.Targets[q.target], zi) && !keys[q.key] {
				keys[q.key] = true
				if q.client.Rotate > 0 {
					rotated = append(rotated, q.key)
				} else {
					order = append(order, q.key)
				}
			}
		}
		for i := len(rotated) - 1; i >= 0 && len(order) < maxProbeKeys; i-- {
			order = append(order, rotated[i])
		}
		for _, key := range order {
			statuses := probe(cl, nodes, z, key)
			held := 0
			for _, st := range statuses {
				if st != http.StatusOK {
					held++
				}
			}
			if held > 0 {
				c.fail(InvSlots, "zone %s key %s: %s after the load and its faults, %d of %d slots were still held by nobody (probe answers %v; lease %s); in Redis: %s",
					z.Name, printable(bucketKey(key)), time.Since(loadEnd).Round(100*time.Millisecond), held, z.Limit, statuses, z.Lease, be.heldSlots(z.Name))
			}
		}
	}
}

// probe sends limit requests of key at once to zone z's probe path, spread
// over the nodes, each held 300 ms by the upstream, and returns their
// statuses.
func probe(cl *http.Client, nodes []*localfleet.Node, z *Zone, key string) []int {
	out := make([]int, z.Limit)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, nodes[i%len(nodes)].URL+probePrefix+z.Name, nil)
			if key != "" {
				req.Header.Set("X-Key", key)
			}
			req.Header.Set("X-Sleep", "300")
			req.Header.Set("X-Req", fmt.Sprintf("probe-%s-%d", z.Name, i))
			resp, err := cl.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			out[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// String is the fault list of a result, for a summary.
func (r *Result) String() string { return strings.Join(r.Faults, " ") }
