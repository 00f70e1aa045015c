package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// config is one simulation: the fleet, its load and its zones.
type config struct {
	// Nodes is how many simulated nodes: each its own limiter, Redis store
	// (connections) and deny cache.
	Nodes int
	// Keys is how many client keys; a request's key is drawn by Zipf rank.
	Keys int
	// ZipfS is the Zipf exponent s (> 1): larger, the more requests go to
	// the top keys.
	ZipfS float64
	// Duration bounds the load.
	Duration time.Duration
	// Workers is, per node, how many requests are in flight at most: with
	// Rate 0 each worker sends its next request as soon as the last is
	// answered (closed loop).
	Workers int
	// Rate, when positive, is the offered load of the whole fleet in
	// requests a second, spread evenly over the nodes: each node starts
	// its requests on a schedule, whether or not the earlier ones were
	// answered (open loop, as HTTP clients make them), as long as one of
	// its Workers is free.
	Rate float64
	// Global and Client select the zones: one bucket for the whole fleet
	// (key "global"), and one per client key.
	Global, Client bool
	// GlobalLimit and ClientLimit are their token buckets (per second).
	GlobalLimit, ClientLimit limit
	// GlobalPrefetch and ClientPrefetch are the zones' RuleConfig.Prefetch
	// (0: none), PrefetchHold their PrefetchHold (0: the default).
	GlobalPrefetch, ClientPrefetch int64
	PrefetchHold                   time.Duration
	// Timeout is the stores' Timeout; MaxWait is twice it.
	Timeout time.Duration
	// Pipelines is the stores' Pipelines.
	Pipelines int
	// Seed seeds the key draws.
	Seed uint64
	// Log, when set, receives progress lines.
	Log func(format string, args ...any)
}

// target is the Redis the fleet shares.
type target struct {
	name     string // "single" or "cluster"
	addrs    []string
	cluster  bool
	username string
	password string
}

// result is one run's measurements.
type result struct {
	Target  string
	Elapsed time.Duration // first request sent to last answer
	// Requests is how many requests the fleet decided (Limiter.Decide
	// calls), Admitted how many it let through, Failed how many the
	// stores failed (failure policy deny: not admitted).
	Requests, Admitted, Failed int64
	// StoreCalls is how many decisions reached Redis (store Decide
	// calls), CacheHits how many the deny caches answered.
	StoreCalls, CacheHits int64
	// Redis is the servers' counters' growth during the load: in all, and
	// per master.
	Redis   serverStats
	Masters []serverStats
	// GlobalMaster is the master holding the global bucket (Cluster).
	GlobalMaster string
	// SimCPU is the CPU time of this process (the fleet and its load)
	// during the load; IdleCPU the cores it used before, with no load.
	SimCPU  time.Duration
	IdleCPU float64
	// Classes are the client keys by Zipf rank; Global the global zone's
	// bucket (nil without the zone).
	Classes []classResult
	Global  *classResult
	// Prefetch reports whether a zone prefetches; PrefetchHits is how
	// many requests the nodes admitted from spares without Redis, and
	// SparesTaken and SparesReturned the spare tokens taken and given
	// back unused (limiter.PrefetchStats).
	Prefetch                                  bool
	PrefetchHits, SparesTaken, SparesReturned int64
}

// OverAdmitted is the tokens admitted above the exact bound, in all.
func (r *result) OverAdmitted() int64 {
	var n int64
	for _, c := range r.Classes {
		n += c.Excess
	}
	if r.Global != nil {
		n += r.Global.Excess
	}
	return n
}

// node is one simulated Caddy node: its limiter, store and deny cache.
type node struct {
	lim   *limiter.Limiter
	store *limiter.RedisStore
	obs   nodeObserver
	seq   atomic.Int64 // open loop: the next request's number
}

// nodeObserver counts a node's store calls and deny cache hits.
type nodeObserver struct {
	calls, errs, hits atomic.Int64
}

// StoreDecided counts a store call, and its error.
func (o *nodeObserver) StoreDecided(_ time.Duration, err error) {
	o.calls.Add(1)
	if err != nil {
		o.errs.Add(1)
	}
}

// CacheDenied counts a deny cache hit.
func (o *nodeObserver) CacheDenied(*limiter.Rule) { o.hits.Add(1) }

// Refunded ignores refunds: the simulation makes none.
func (o *nodeObserver) Refunded(*limiter.Rule, error) {}

// reset zeroes the counts (after the warm-up).
func (o *nodeObserver) reset() { o.calls.Store(0); o.errs.Store(0); o.hits.Store(0) }

// add adds the counts to the totals.
func (o *nodeObserver) add(calls, errs, hits *int64) {
	*calls += o.calls.Load()
	*errs += o.errs.Load()
	*hits += o.hits.Load()
}

// close gives back the node's spares, then closes its connections.
func (n *node) close() {
	n.lim.Close()
	_ = n.store.Close()
}

// interval is, in the open loop, the time between two requests of a node.
func (c *config) interval() time.Duration {
	return time.Duration(float64(c.Nodes) / c.Rate * float64(time.Second))
}

func (c *config) logf(format string, args ...any) {
	if c.Log != nil {
		c.Log(format, args...)
	}
}

var _ limiter.Observer = (*nodeObserver)(nil)

// prefetchHold is the PrefetchHold of a zone with prefetch n: none without
// a prefetch (NewRule refuses a hold alone).
func (c *config) prefetchHold(n int64) time.Duration {
	if n == 0 {
		return 0
	}
	return c.PrefetchHold
}

// rules compiles the zones, and the warm-up zone.
func (c *config) rules() (global, client, warm *limiter.Rule, err error) {
	if c.Global {
		global, err = limiter.NewRule(limiter.RuleConfig{
			Name: "global", Rate: c.GlobalLimit.rate, Per: time.Second, Burst: c.GlobalLimit.burst, OnError: limiter.PolicyDeny,
			Prefetch: c.GlobalPrefetch, PrefetchHold: c.prefetchHold(c.GlobalPrefetch),
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("global zone: %w", err)
		}
	}
	if c.Client {
		client, err = limiter.NewRule(limiter.RuleConfig{
			Name: "client", Rate: c.ClientLimit.rate, Per: time.Second, Burst: c.ClientLimit.burst, OnError: limiter.PolicyDeny,
			Prefetch: c.ClientPrefetch, PrefetchHold: c.prefetchHold(c.ClientPrefetch),
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("client zone: %w", err)
		}
	}
	warm, err = limiter.NewRule(limiter.RuleConfig{Name: "warmup", Rate: 1000, Per: time.Second, OnError: limiter.PolicyDeny})
	return global, client, warm, err
}

// simulate runs one simulation against t and measures it.
func simulate(ctx context.Context, c config, t target) (*result, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	global, client, warm, err := c.rules()
	if err != nil {
		return nil, err
	}
	// A prefix of this run's own: buckets of earlier runs against the
	// same Redis would start emptier than the bound assumes full.
	prefix := "sim:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"

	mon := newMonitor(t)
	defer mon.close()

	c.logf("%s: starting %d nodes ...", t.name, c.Nodes)
	nodes := make([]*node, c.Nodes)
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.close()
			}
		}
	}()
	if err := startNodes(c, t, prefix, nodes); err != nil {
		return nil, err
	}
	if err := warmUp(ctx, nodes, warm); err != nil {
		return nil, err
	}
	idle, err := idleCPU(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		n.obs.reset()
	}
	res := &result{Target: t.name, Prefetch: c.GlobalPrefetch > 0 || c.ClientPrefetch > 0, IdleCPU: idle}
	if c.Global {
		res.GlobalMaster = mon.masterOf(ctx, prefix+"global:{global}")
	}

	before, err := mon.stats(ctx)
	if err != nil {
		return nil, err
	}
	cpu0 := processCPU()
	c.logf("%s: loading %d nodes x %d workers for %s ...", t.name, c.Nodes, c.Workers, c.Duration)
	w, elapsed := drive(ctx, &c, nodes, global, client)
	after, err := mon.stats(ctx)
	if err != nil {
		return nil, err
	}
	res.SimCPU = processCPU() - cpu0
	res.measure(c, nodes, w, before, after, elapsed)
	return res, nil
}

// check reports a configuration that cannot run.
func (c *config) check() error {
	switch {
	case c.Nodes < 1 || c.Keys < 1 || c.Workers < 1:
		return errors.New("nodes, keys and workers must be positive")
	case c.ZipfS <= 1:
		return errors.New("the Zipf exponent must be above 1")
	case !c.Global && !c.Client:
		return errors.New("no zone: choose global, client or both")
	}
	return nil
}

// drive loads the nodes with c.Workers workers each for c.Duration, and
// returns the load, which holds what each key got, and how long it took.
func drive(ctx context.Context, c *config, nodes []*node, global, client *limiter.Rule) (*load, time.Duration) {
	keys := make([]string, c.Keys)
	for i := range keys {
		keys[i] = "u" + strconv.Itoa(i)
	}
	ctx, cancel := context.WithTimeout(ctx, c.Duration)
	defer cancel()
	t0 := time.Now()
	w := &load{cfg: c, t0: t0, end: t0.Add(c.Duration), global: global, client: client, keys: keys,
		stats: make([]keyStat, c.Keys), gstat: new(keyStat)}
	var wg sync.WaitGroup
	for i, n := range nodes {
		for j := range c.Workers {
			wg.Go(func() { w.run(ctx, n, uint64(i*c.Workers+j)) })
		}
	}
	wg.Wait()
	return w, time.Since(t0)
}

// idleCPU measures, for a second with no load, the share of a CPU the
// nodes' own background work takes (each store's timers): in a real fleet
// every node pays it once; here one process pays it for all of them.
func idleCPU(ctx context.Context) (float64, error) {
	idle0, idleT := processCPU(), time.Now()
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return float64(processCPU()-idle0) / float64(time.Since(idleT)), nil
}

// startNodes starts the simulated nodes, each with its own Redis store
// (connections), deny cache and limiter, into nodes.
func startNodes(c config, t target, prefix string, nodes []*node) error {
	for i := range nodes {
		n := &node{}
		opt := limiter.RedisOptions{
			Cluster: t.cluster, Username: t.username, Password: t.password, KeyPrefix: prefix,
			// Generous: the nodes, Redis and the load share this machine's
			// CPUs; a decision that failed would count as denied.
			Timeout: c.Timeout, MaxWait: 2 * c.Timeout, Pipelines: c.Pipelines,
		}
		opt.Address, opt.Addresses = t.addrs[0], t.addrs[1:]
		var err error
		if n.store, err = limiter.NewRedisStore(opt); err != nil {
			return err
		}
		fleet := int64(c.Nodes)
		n.lim = limiter.New(n.store, limiter.Options{
			Cache:    limiter.NewDenyCache(limiter.DenyCacheOptions{}),
			Observer: &n.obs,
			// What a Caddy node's fleet view reports once every node
			// has reported (prefetch paces by it).
			FleetSize: func() int64 { return fleet },
		})
		nodes[i] = n
	}
	return nil
}

// measure fills the result of a run from the load's counts, the nodes'
// and Redis' before and after.
func (res *result) measure(c config, nodes []*node, w *load, before, after []serverStats, elapsed time.Duration) {
	res.Masters = deltas(before, after)
	res.Redis = total(res.Masters)
	res.Elapsed = elapsed
	res.Requests, res.Admitted, res.Failed = w.requests.Load(), w.admitted.Load(), w.failed.Load()
	var errs int64
	for _, n := range nodes {
		n.obs.add(&res.StoreCalls, &errs, &res.CacheHits)
		ps := n.lim.PrefetchStats(nil)
		res.PrefetchHits += int64(ps.Hits)
		res.SparesTaken += int64(ps.Taken)
		res.SparesReturned += int64(ps.Returned)
	}
	if c.Client {
		res.Classes = summarize(w.stats, c.ClientLimit)
	}
	if c.Global {
		g := classResult{Name: "global", Lo: 0, Hi: 1}
		gstat := w.gstat
		g.add(gstat.offered.Load(), gstat.eligible.Load(), gstat.admitted.Load(), gstat.first.Load()-1, gstat.last.Load()-1, c.GlobalLimit)
		res.Global = &g
	}
}

// warmUp makes each node connect and load the scripts (on every master of a
// Cluster: the keys spread over slots) before the load is measured.
func warmUp(ctx context.Context, nodes []*node, warm *limiter.Rule) error {
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i, n := range nodes {
		wg.Go(func() {
			reqs := make([]limiter.Request, 1)
			res := make([]limiter.Result, 1)
			for k := range 16 {
				reqs[0] = limiter.Request{Rule: warm, Key: "n" + strconv.Itoa(i) + "k" + strconv.Itoa(k), Cost: 1}
				ok := false
				for try := 0; try < 50 && !ok && ctx.Err() == nil; try++ {
					ok = n.lim.Decide(ctx, reqs, res) == limiter.Allowed
					if !ok {
						time.Sleep(100 * time.Millisecond)
					}
				}
				if !ok {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("warming up: %d decisions of the warm-up zone failed: is Redis reachable?", n)
	}
	return ctx.Err()
}

// load is the running load of one simulation.
type load struct {
	cfg            *config
	t0, end        time.Time
	global, client *limiter.Rule
	keys           []string
	stats          []keyStat
	gstat          *keyStat

	requests, admitted, failed atomic.Int64
}

// run is one worker of node n: it draws keys by Zipf rank and decides their
// requests until ctx ends.
func (l *load) run(ctx context.Context, n *node, id uint64) {
	c := l.cfg
	r := rand.New(rand.NewPCG(c.Seed, id))
	zipf := rand.NewZipf(r, c.ZipfS, 1, uint64(c.Keys-1))
	var reqs []limiter.Request
	gi, ci := -1, -1
	if l.global != nil {
		gi = len(reqs)
		reqs = append(reqs, limiter.Request{Rule: l.global, Key: "global", Cost: 1})
	}
	if l.client != nil {
		ci = len(reqs)
		reqs = append(reqs, limiter.Request{Rule: l.client, Cost: 1})
	}
	results := make([]limiter.Result, len(reqs))
	var interval time.Duration
	if c.Rate > 0 {
		interval = c.interval()
	}
	var requests, admitted, failed int64
	defer func() {
		l.requests.Add(requests)
		l.admitted.Add(admitted)
		l.failed.Add(failed)
	}()
	for ctx.Err() == nil {
		if interval > 0 {
			due := l.t0.Add(time.Duration(n.seq.Add(1)-1) * interval)
			if !due.Before(l.end) {
				return
			}
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
		}
		rank := int(zipf.Uint64())
		if ci >= 0 {
			reqs[ci].Key = l.keys[rank]
		}
		send := int64(time.Since(l.t0))
		out := n.lim.Decide(context.Background(), reqs, results)
		answer := int64(time.Since(l.t0))
		requests++
		ok := out == limiter.Allowed
		decided := ok || out == limiter.Denied
		if ok {
			admitted++
		} else if !decided {
			failed++
		}
		// A zone's request is eligible when no other zone denied it.
		if ci >= 0 {
			l.stats[rank].note(send, answer, decided && (gi < 0 || results[gi].Allowed), ok)
		}
		if gi >= 0 {
			l.gstat.note(send, answer, decided && (ci < 0 || results[ci].Allowed), ok)
		}
	}
}
