// Command fleetsim simulates a large fleet on one machine: many nodes, each
// with its own limiter, Redis store (its own connections) and deny cache,
// deciding requests of one global zone (key "global") and a per-client zone
// over a million client keys drawn by Zipf rank, against a single Redis and
// a Redis Cluster of three masters (started here, or given). It prints what
// Redis spends per decision (CPU from INFO, script time from commandstats),
// its round trips and script calls, and every bucket's admissions against
// the exact bound burst + rate x elapsed, per class of keys.
//
//	go run ./cmd/fleetsim [-nodes 100] [-workers 4 | -rate 20000] [-keys 1000000] [-duration 10s] [-runs 3]
//
// It needs redis-server and redis-cli on PATH unless given -redis or
// -cluster. It exits 1 if any bucket admitted more than its bound.
// docs/sizing.md explains the figures and what they predict.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/progenv"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func main() {
	var c config
	var zones, topo, single, cluster, username, password string
	var masters, runs int
	flag.IntVar(&c.Nodes, "nodes", 100, "simulated nodes, each with its own limiter, Redis connections and deny cache")
	flag.IntVar(&c.Workers, "workers", 4, "requests in flight per node at most (closed loop: each sends its next request when the last is answered; with -rate: default 256)")
	flag.Float64Var(&c.Rate, "rate", 0, "offered requests a second for the whole fleet, open loop: each node starts its requests on a schedule, whether or not the earlier ones were answered, as HTTP clients do (up to -workers in flight); 0: closed loop")
	flag.IntVar(&c.Keys, "keys", 1_000_000, "client keys")
	flag.Float64Var(&c.ZipfS, "zipf", 1.1, "Zipf exponent s of the key ranks (> 1)")
	flag.DurationVar(&c.Duration, "duration", 10*time.Second, "how long each run loads the fleet")
	flag.StringVar(&zones, "zones", "global,client", "zones of every request: global, client, or both")
	flag.Int64Var(&c.GlobalLimit.rate, "global-rate", 1_000_000, "global zone: tokens a second")
	flag.Int64Var(&c.GlobalLimit.burst, "global-burst", 0, "global zone: burst (0: the rate)")
	flag.Int64Var(&c.ClientLimit.rate, "client-rate", 10, "client zone: tokens a second per key")
	flag.Int64Var(&c.ClientLimit.burst, "client-burst", 20, "client zone: burst per key (0: the rate)")
	flag.Int64Var(&c.GlobalPrefetch, "prefetch", 0, "global zone: prefetch, the most tokens a node takes in one decision and admits from locally (RuleConfig.Prefetch; 0: none)")
	flag.Int64Var(&c.ClientPrefetch, "client-prefetch", 0, "client zone: prefetch (0: none)")
	flag.DurationVar(&c.PrefetchHold, "prefetch-hold", 0, "how long a node keeps unused spares (RuleConfig.PrefetchHold; 0: the limiter's default)")
	flag.DurationVar(&c.Timeout, "timeout", 2*time.Second, "the stores' decision timeout (generous: everything shares this machine)")
	flag.IntVar(&c.Pipelines, "pipelines", 1, "round trips in flight per node store")
	flag.Uint64Var(&c.Seed, "seed", 1, "seed of the key draws")
	flag.StringVar(&topo, "topology", "single,cluster", "Redis set-ups to start and run against: single, cluster, or both")
	flag.IntVar(&masters, "masters", 3, "masters of the Cluster started")
	flag.StringVar(&single, "redis", "", "host:port of a Redis to use instead of starting one (its INFO counters are read)")
	flag.StringVar(&cluster, "cluster", "", "comma-separated seed host:port of a Redis Cluster to use instead of starting one")
	flag.StringVar(&username, "username", "", "ACL user of the given Redis (-redis, -cluster); it needs INFO too")
	flag.StringVar(&password, "password", "", "password of the given Redis (-redis, -cluster)")
	flag.IntVar(&runs, "runs", 1, "runs per topology; medians are printed too")
	cpuProfile := flag.String("cpuprofile", "", "write this process' CPU profile (the simulated fleet and its load) to this file")
	flag.Parse()
	workersSet := false
	flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
	if c.Rate > 0 && !workersSet {
		// Open loop: a decision that waits (for Redis, or for the node's
		// call in flight on a prefetched key) must not hold back the
		// requests due after it, as it does not for HTTP clients.
		c.Workers = 256
	}

	for z := range strings.SplitSeq(zones, ",") {
		switch strings.TrimSpace(z) {
		case "global":
			c.Global = true
		case "client":
			c.Client = true
		default:
			fmt.Fprintf(os.Stderr, "fleetsim: -zones: unknown zone %q (global, client)\n", z)
			os.Exit(2)
		}
	}
	if c.GlobalLimit.burst == 0 {
		c.GlobalLimit.burst = c.GlobalLimit.rate
	}
	if c.ClientLimit.burst == 0 {
		c.ClientLimit.burst = c.ClientLimit.rate
	}
	c.Log = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

	env := progenv.New("fleetsim")
	defer env.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	targets := startTargets(env, topo, single, cluster, username, password, masters)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			env.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			env.Fatal(err)
		}
		env.Cleanup(func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		})
	}
	code := run(ctx, c, targets, runs)
	env.Close()
	os.Exit(code)
}

// startTargets returns the Redis set-ups to run against: the given ones,
// else those of topo, started here.
func startTargets(env *progenv.Env, topo, single, cluster, username, password string, masters int) []target {
	var ts []target
	if single != "" {
		ts = append(ts, target{name: "single", addrs: []string{single}, username: username, password: password})
	}
	if cluster != "" {
		ts = append(ts, target{name: "cluster", addrs: strings.Split(cluster, ","), cluster: true, username: username, password: password})
	}
	if len(ts) > 0 {
		return ts
	}
	for t := range strings.SplitSeq(topo, ",") {
		switch strings.TrimSpace(t) {
		case "single":
			r := redistest.Start(env, "--maxclients", "10000")
			ts = append(ts, target{name: "single", addrs: []string{r.Addr}})
		case "cluster":
			cl := redistest.StartCluster(env, masters, "--maxclients", "10000")
			ts = append(ts, target{name: fmt.Sprintf("cluster of %d", masters), addrs: cl.Addrs(), cluster: true})
		default:
			env.Fatalf("-topology: unknown set-up %q (single, cluster)", t)
		}
	}
	return ts
}

// run runs every target runs times and prints the results; it returns the
// exit code.
func run(ctx context.Context, c config, targets []target, runs int) int {
	fmt.Println(describe(c))
	fmt.Printf("load average at start: %s\n", loadAverage())
	code := 0
	for _, t := range targets {
		var rs []*result
		for i := range runs {
			rc := c
			rc.Seed = c.Seed + uint64(i)
			r, err := simulate(ctx, rc, t)
			if err != nil {
				fmt.Fprintf(os.Stderr, "fleetsim: %s: %v\n", t.name, err)
				return 2
			}
			c.logf("%s run %d: %.0f requests/s, load average %s", t.name, i+1, perSecond(r.Requests, r.Elapsed), loadAverage())
			rs = append(rs, r)
			if r.OverAdmitted() > 0 {
				code = 1
			}
		}
		fmt.Println()
		fmt.Printf("## %s (%s)\n\n", t.name, strings.Join(t.addrs, ", "))
		fmt.Println(summaryTable(rs))
		fmt.Println(classTable(rs))
		if t.cluster {
			fmt.Println(masterTable(rs))
		}
	}
	fmt.Printf("load average at end: %s\n", loadAverage())
	if code != 0 {
		fmt.Println("FAIL: a bucket admitted more than burst + rate x elapsed")
	} else {
		fmt.Println("PASS: no bucket admitted more than burst + rate x elapsed")
	}
	return code
}
