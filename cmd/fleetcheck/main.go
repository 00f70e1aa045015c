// Command fleetcheck starts a local fleet (one redis-server and several
// Caddy nodes built from cmd/caddy, all on loopback), drives concurrent load
// spread over the nodes, and prints, for every bucket, what the fleet
// admitted against the exact bound burst + rate x elapsed, and per node.
//
//	go run ./cmd/fleetcheck [-nodes 3] [-connections 60] [-duration 10s]
//
// It needs redis-server on PATH. It exits 1 if any bucket broke its bound.
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
	duration := flag.Duration("duration", 10*time.Second, "how long to load the fleet")
	flag.Parse()

	env := progenv.New("fleetcheck")
	defer env.Close()
	code := run(env, *nodes, *conns, *duration)
	env.Close()
	os.Exit(code)
}

func run(env *progenv.Env, nodeCount, conns int, d time.Duration) int {
	fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
	bin, err := localfleet.BuildCaddy(env.TempDir())
	if err != nil {
		env.Fatal(err)
	}
	r := redistest.Start(env)
	// A generous timeout: on one machine the nodes, Redis and the load
	// generator share the CPUs, and a decision that failed open would leave
	// its bucket's bound uncheckable.
	sc := localfleet.Exactness(fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t\ttimeout 2s\n\t\t}", r.Addr))
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
