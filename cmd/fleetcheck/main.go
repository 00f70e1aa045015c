// Command fleetcheck starts a local fleet (one redis-server and several
// Caddy nodes built from cmd/caddy, all on loopback), drives concurrent load
// spread over the nodes, and prints, for every bucket, what the fleet
// admitted against the exact bound burst + rate x elapsed, and per node.
//
//	go run ./cmd/fleetcheck [-nodes 3] [-connections 60] [-duration 10s]
//
// It needs redis-server on PATH. It exits 1 if any bucket broke its bound.
//
// With -prefetch it measures prefetch on a hot key instead: one zone per
// case, each with `key global` and `prefetch`, loaded in open loop (HTTP
// requests started on a schedule, spread round robin over the nodes) at
// each of -loads times the case's rate, -duration each (3s unless given).
// It prints a Markdown table per case: offered and achieved requests a
// second, requests dropped and how late they went out, whether the run was
// clean (nothing dropped, the 99th percentile late by at most half the
// time the rate takes to refill the burst), Redis' script calls per
// admitted request, the admitted tokens against the exact bound and
// against what the fleet could reach given when the requests went out, and
// what each node's prefetch did. The targets: below the rate every request
// admitted; above it at most the case's script calls per admitted request
// and at least 0.97 of the exact bound. It exits 1 if a key went above its
// bound, requests failed, or a clean run missed a target; a run that was
// not clean is reported as such.
//
//	go run ./cmd/fleetcheck -prefetch [-nodes 3] [-loads 0.5,1.05,1.5,3] [-duration 3s] [-prefetch-case RATE/BURST/PREFETCH[/MAXCALLS],...]
//
// The default cases are 5000/s burst 500 prefetch 100 (at most 0.05 calls
// per admitted request) and 2000/s burst 200 prefetch 20 (at most 0.2).
// -prefetch-case replaces them: rate a second, burst, prefetch, and
// optionally the most script calls per admitted request, which is
// otherwise (nodes + 1) / prefetch, and at least 0.05.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/progenv"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func main() {
	nodes := flag.Int("nodes", 3, "Caddy nodes in the fleet")
	conns := flag.Int("connections", 60, "connections in all, spread evenly over the nodes")
	duration := flag.Duration("duration", 10*time.Second, "how long to load the fleet (-prefetch: each load; default 3s)")
	prefetch := flag.Bool("prefetch", false, "measure prefetch on hot keys instead of exactness (see -loads, -prefetch-case)")
	loadList := flag.String("loads", "0.5,1.05,1.5,3", "-prefetch: offered loads, as multiples of each case's rate")
	caseList := flag.String("prefetch-case", "", "-prefetch: cases RATE/BURST/PREFETCH[/MAXCALLS], comma-separated, instead of the default two")
	flag.Parse()

	if !*prefetch {
		env := progenv.New("fleetcheck")
		defer env.Close()
		code := run(env, *nodes, *conns, *duration)
		env.Close()
		os.Exit(code)
	}
	durationSet := false
	flag.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
	if !durationSet {
		*duration = 3 * time.Second
	}
	loads, err := parseLoads(*loadList)
	cases := localfleet.PrefetchCases()
	if err == nil && *caseList != "" {
		cases, err = parseCases(*caseList, *nodes)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetcheck:", err)
		os.Exit(2)
	}
	env := progenv.New("fleetcheck")
	defer env.Close()
	code := runPrefetch(env, *nodes, *duration, loads, cases)
	env.Close()
	os.Exit(code)
}

// redisBlock is the nodes' `redis { ... }` block for the Redis at addr. A
// generous timeout: on one machine the nodes, Redis and the load generator
// share the CPUs, and a decision that failed open would leave its bucket's
// bound uncheckable.
func redisBlock(addr string) string {
	return fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t\ttimeout 2s\n\t\t}", addr)
}

func run(env *progenv.Env, nodeCount, conns int, d time.Duration) int {
	fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
	bin, err := localfleet.BuildCaddy(env.TempDir())
	if err != nil {
		env.Fatal(err)
	}
	r := redistest.Start(env)
	sc := localfleet.Exactness(redisBlock(r.Addr))
	nodes := make([]*localfleet.Node, nodeCount)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i] = localfleet.StartNode(env, bin, "", sc.Site)
		}()
	}
	wg.Wait()
	fmt.Fprintf(os.Stderr, "redis on %s; %d caddy nodes:", r.Addr, nodeCount)
	for _, n := range nodes {
		fmt.Fprintf(os.Stderr, " %s", n.URL)
	}
	fmt.Fprintf(os.Stderr, "\nloading them with %d connections for %s ...\n", conns, d)

	rep := localfleet.Run(context.Background(), localfleet.Load{Nodes: nodes, Targets: sc.Targets, Connections: conns, Duration: d})
	fmt.Printf("%d nodes, %d connections, %s; one Redis\n\n", nodeCount, conns, rep.Duration.Round(time.Millisecond))
	fmt.Println("Admitted tokens per bucket against the exact bound burst + rate x elapsed (elapsed: first request sent to last answer):")
	fmt.Println()
	fmt.Println(rep.Table())
	fmt.Println("Requests per target and the zone that denied them:")
	fmt.Println()
	fmt.Println(rep.DeniedTable(sc.Targets))
	if bad := rep.Check(); len(bad) > 0 {
		for _, b := range bad {
			fmt.Println("FAIL:", b)
		}
		return 1
	}
	fmt.Println("PASS: no bucket above its bound; every saturated bucket at 98% of it or more.")
	return 0
}
