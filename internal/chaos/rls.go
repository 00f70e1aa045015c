package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// RLS clients: each node also runs the rate_limit_rls app (Envoy's rate
// limit service) with rules that name zones of the site (`zone:`), and a
// client calls ShouldRateLimit on the nodes, as Envoy's filter does, on
// the key of an HTTP client: one descriptor per shared zone, each spending
// that zone's bucket of the key. The bound of those buckets counts the
// calls answered OK beside the requests the upstream saw, with the same
// allowances: Envoy's calls and Caddy's requests spend one limit.

// KindRLS is the kind of the RLS client's calls (it is not among the
// scenario's HTTP clients).
const KindRLS = "rls"

// InvRLS names the invariant: every call is answered OK or OVER_LIMIT,
// but while its node is down.
const InvRLS = "rls"

// rlsDomain is the domain of the scenario's RLS rules.
const rlsDomain = "chaos"

// rlsDeadline is each call's deadline: the decision waits for the store at
// most half of it, so that Redis' timeout (redisTimeout), as for the HTTP
// requests, is what ends a wait, not the deadline.
const rlsDeadline = 2 * time.Second

// RLSLoad is the scenario's RLS client.
type RLSLoad struct {
	// Zones are the indexes of the zones the calls spend, one descriptor
	// each (its key the zone's name).
	Zones []int
	// Key is the descriptors' value: the X-Key of the HTTP client whose
	// buckets the calls share.
	Key string
	// Hits is each call's hits_addend.
	Hits int64
	// Workers is how many calls are in flight at once.
	Workers int
}

// rlsShareable reports whether zone zi can be spent by the RLS service
// (rate_limit zones that need no HTTP request: no placeholder rate, no
// delay, no slot) and is one whose bound the checker keeps alone (no
// quota, no cost_header, not a dry run, not the victim's).
func (s *Scenario) rlsShareable(zi int) bool {
	z := s.Zones[zi]
	switch z.Algorithm {
	case TokenBucket, FixedWindow, SlidingWindow, SlidingLog:
	default:
		return false
	}
	return !z.Global && !z.Tiered && !z.DryRun && z.Quota == 0 && z.SoftShed == 0 && !z.CostHeader && !s.onVictimTarget(zi)
}

// drawRLS draws, from its own stream (drawFeatures), whether the scenario
// has an RLS client, and if so the steady HTTP client whose key it calls
// with and the shareable zones of that client's targets it spends.
func (s *Scenario) drawRLS(r *rand.Rand) {
	if r.IntN(2) == 0 {
		return
	}
	for _, ci := range r.Perm(len(s.Clients)) {
		c := s.Clients[ci]
		if c.Kind != KindSteady || c.Key == "" {
			continue
		}
		var zones []int
		for _, ti := range c.Targets {
			for _, zi := range s.Targets[ti].Zones {
				if s.rlsShareable(zi) && !hasIndex(zones, zi) {
					zones = append(zones, zi)
				}
			}
		}
		if len(zones) == 0 {
			continue
		}
		s.RLS = &RLSLoad{Zones: zones, Key: c.Key, Hits: 1 + r.Int64N(2), Workers: 1 + r.IntN(2)}
		return
	}
}

func hasIndex(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// rlsSummary names the RLS client's zones, for the scenario's summary.
func (s *Scenario) rlsSummary() string {
	if s.RLS == nil {
		return ""
	}
	var zs []string
	for _, zi := range s.RLS.Zones {
		zs = append(zs, s.Zones[zi].Name)
	}
	return ", rls on " + strings.Join(zs, " ")
}

// rlsRules is the YAML of the scenario's RLS rules: a descriptor key per
// shared zone, named as the zone, whose rule spends it.
func (s *Scenario) rlsRules() string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", rlsDomain)
	for _, zi := range s.RLS.Zones {
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit:\n      zone: %s\n", s.Zones[zi].Name, s.Zones[zi].Name)
	}
	return b.String()
}

// rlsGlobals writes the rules into a directory of t's and returns, per
// node, the rate_limit_rls global option on a port of its own, with the
// site's store block (empty: the memory store), so that the rules can
// name the site's zones. Without an RLS client it returns empty options.
func (s *Scenario) rlsGlobals(t redistest.T, nodes int, redisBlock string) (globals []string, addrs []string) {
	globals, addrs = make([]string, nodes), make([]string, nodes)
	if s.RLS == nil {
		return globals, addrs
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, rlsDomain+".yaml"), []byte(s.rlsRules()), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range globals {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
		globals[i] = fmt.Sprintf("\trate_limit_rls {\n\t\tlisten %s\n\t\tconfig_dir %s\n%s\t}", addrs[i], dir, redisBlock)
	}
	return globals, addrs
}

// runRLS runs the RLS client's workers against the nodes' services at
// addrs until ctx ends, and returns every call, as requests of kind
// KindRLS: status 200 for OK, 429 for OVER_LIMIT, 0 for a failed call.
func (s *Scenario) runRLS(ctx context.Context, addrs []string) []*request {
	if s.RLS == nil {
		return nil
	}
	clients := make([]rlsv3.RateLimitServiceClient, len(addrs))
	for i, a := range addrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return []*request{{id: "rls-dial", client: rlsClient(s.RLS), err: err.Error()}}
		}
		defer conn.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(conn)
	}
	var (
		mu  sync.Mutex
		all []*request
		wg  sync.WaitGroup
	)
	c := rlsClient(s.RLS)
	for w := range s.RLS.Workers {
		wg.Go(func() {
			got := s.rlsWorker(ctx, c, w, clients)
			mu.Lock()
			all = append(all, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all
}

// rlsClient is the client the RLS calls are charged to in the buckets.
func rlsClient(l *RLSLoad) *Client {
	return &Client{ID: -1, Kind: KindRLS, Key: l.Key, Tier: "default", Cost: l.Hits, Workers: l.Workers}
}

// rlsWorker is one worker of the RLS client: one call at a time, to a
// node drawn at random.
func (s *Scenario) rlsWorker(ctx context.Context, c *Client, w int, clients []rlsv3.RateLimitServiceClient) []*request {
	r := rand.New(rand.NewPCG(s.Seed, uint64(0x7215_0000+w)))
	req := &rlsv3.RateLimitRequest{Domain: rlsDomain, HitsAddend: uint32(s.RLS.Hits)}
	for _, zi := range s.RLS.Zones {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: s.Zones[zi].Name, Value: s.RLS.Key}}})
	}
	var out []*request
	for i := 0; ctx.Err() == nil; i++ {
		q := &request{id: fmt.Sprintf("rls-%d-%d", w, i), client: c, key: s.RLS.Key, cost: s.RLS.Hits, node: r.IntN(len(clients)), rls: true}
		callCtx, cancel := context.WithTimeout(context.Background(), rlsDeadline)
		q.sent = time.Now()
		resp, err := clients[q.node].ShouldRateLimit(callCtx, req)
		q.done = time.Now()
		cancel()
		switch {
		case err != nil:
			q.err = err.Error()
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			q.status = 200
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			q.status = 429
		default:
			q.err = "overall code " + resp.GetOverallCode().String()
		}
		if ctx.Err() != nil && q.err != "" {
			break // the load ended while this call was in flight
		}
		out = append(out, q)
	}
	return out
}

// checkRLS checks that every RLS call was answered OK or OVER_LIMIT but
// while its node was down (a kill -9 until its restart, and a second for
// the client to reconnect), and records the calls' figures.
func (c *checker) checkRLS() {
	if c.s.RLS == nil {
		return
	}
	var ok, over, failed, down int
	var example *request
	for _, q := range c.o.rlsCalls {
		switch {
		case q.status == 200:
			ok++
		case q.status == 429:
			over++
		case c.inFault(q.sent, q.done, 0, time.Second, func(kind string) bool { return kind == FaultNodeKill }):
			down++
		default:
			failed++
			if example == nil {
				example = q
			}
		}
	}
	var zs []string
	for _, zi := range c.s.RLS.Zones {
		zs = append(zs, c.s.Zones[zi].Name)
	}
	c.figures = append(c.figures, fmt.Sprintf("rls: %d calls of key %s on zones [%s], %d hits each: %d OK, %d OVER_LIMIT, %d failed while a node was down, %d failed; tightest shared bucket: %s",
		len(c.o.rlsCalls), printable(c.s.RLS.Key), strings.Join(zs, " "), c.s.RLS.Hits, ok, over, down, failed, c.rlsTightest))
	if failed > 0 {
		c.fail(InvRLS, "%d RLS calls failed outside a node's kill, e.g. through node %d at %s: %s%s", failed, example.node,
			example.sent.Format("15:04:05.000"), example.err, c.sinceFault(example.sent, func(string) bool { return true }))
	}
}

// rlsReload returns the reload of the fleet's nodes, each with its own
// global options.
func rlsReload(nodes []*localfleet.Node, globals []string, site func(gen int) string) func(*localfleet.Node, int) error {
	return func(n *localfleet.Node, gen int) error {
		for i, m := range nodes {
			if m == n {
				return n.Reload(globals[i], site(gen))
			}
		}
		return fmt.Errorf("reloading a node that is not the fleet's")
	}
}
