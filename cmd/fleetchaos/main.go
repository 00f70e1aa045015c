// Command fleetchaos is the fleet's invariant checker: it draws scenarios
// from seeds (zones of every algorithm and policy composed, honest and
// hostile clients, a Redis topology, faults), runs each over real processes
// on loopback (Caddy nodes built from cmd/caddy, redis-server single,
// Cluster or Sentinel, a small upstream), breaks the fleet on purpose
// (Redis SIGSTOP, SIGKILL and restart, CLIENT KILL, DEBUG SLEEP, Sentinel
// failover, Caddy reloads and kill -9, CPU stress) and checks the
// invariants after each: every bucket within its exact bound plus the
// named allowances, no concurrency slot held by nobody, no banned key
// admitted, count_status exact, resources back at baseline after reloads,
// no unexpected 5xx. See internal/chaos.
//
//	go run ./cmd/fleetchaos [-seed 1] [-scenarios 5] [-for 30m] [-load 10s] [-topology single,cluster]
//
// Seeds run from -seed upwards: -scenarios of them, or as many as -for
// allows. Every violation is printed with its seed and a one-line
// reproduction; the command exits 1 if there was any. The closing lines
// count the scenarios by topology, fault and violation, the requests sent
// and admitted, the run time per scenario, and how close each scenario's
// tightest bucket came to its bound (admitted tokens over the exact bound
// plus its allowances). It needs redis-server, redis-sentinel and
// stress-ng on PATH.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/chaos"
	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/progenv"
)

func main() {
	seed := flag.Uint64("seed", 1, "the first seed")
	scenarios := flag.Int("scenarios", 5, "how many seeds to run (with -for: at most; 0 for no limit)")
	forD := flag.Duration("for", 0, "run seeds until this much time has passed (0: run -scenarios seeds)")
	load := flag.Duration("load", 10*time.Second, "how long each scenario's clients send")
	topo := flag.String("topology", "", "comma-separated topologies to draw from (single, cluster, sentinel, memory); default all")
	explain := flag.Bool("explain", false, "print each violation's trace (the faults, the requests of its key around it), the site and the clients")
	flag.Parse()

	o := chaos.Options{Load: *load, Explain: *explain}
	for _, t := range strings.Split(*topo, ",") {
		if t != "" {
			o.Topologies = append(o.Topologies, chaos.Topology(t))
		}
	}
	build := progenv.New("fleetchaos")
	fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
	bin, err := localfleet.BuildCaddy(build.TempDir())
	if err != nil {
		build.Fatal(err)
	}

	began := time.Now()
	var runs, bad, requests, admitted int
	var tightest []*chaos.Result
	var took []time.Duration
	byTop, byFault, violations := map[string]int{}, map[string]int{}, map[string]int{}
	for s := *seed; ; s++ {
		if *forD > 0 && time.Since(began) >= *forD {
			break
		}
		if *scenarios > 0 && runs >= *scenarios {
			break
		}
		if *forD == 0 && *scenarios == 0 {
			break
		}
		env := progenv.New("fleetchaos")
		res := chaos.Run(env, bin, chaos.Draw(s, o))
		env.Close()
		res.Print(os.Stdout, o)
		runs++
		requests, admitted = requests+res.Requests, admitted+res.Admitted
		tightest, took = append(tightest, res), append(took, res.Took)
		byTop[string(res.Scenario.Topology)]++
		for _, f := range res.Faults {
			byFault[f]++
		}
		if len(res.Violations) > 0 {
			bad++
		}
		for _, v := range res.Violations {
			violations[v.Invariant]++
		}
	}
	build.Close()
	fmt.Printf("\n%d scenarios in %s, %d with violations\n", runs, time.Since(began).Round(time.Second), bad)
	fmt.Println("by topology:", counts(byTop))
	fmt.Println("faults injected:", counts(byFault))
	fmt.Println("violations by invariant:", counts(violations))
	fmt.Printf("requests: %d sent, %d admitted\n", requests, admitted)
	fmt.Println("run time per scenario:", spread(took))
	fmt.Println("admitted over bound + allowances, the tightest bucket of each scenario:", tightness(tightest))
	if bad > 0 {
		os.Exit(1)
	}
}

// counts renders a count map as "name n, ...", sorted by name.
func counts(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var out []string
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// spread renders durations as their median and extremes.
func spread(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	return fmt.Sprintf("median %s, min %s, max %s", d[len(d)/2].Round(time.Second), d[0].Round(time.Second), d[len(d)-1].Round(time.Second))
}

// tightness renders the results' tightest buckets: the median and the
// largest share of its bound (with its allowances) a bucket was admitted,
// and the seed and bucket of the largest.
func tightness(results []*chaos.Result) string {
	var uses []float64
	var most *chaos.Result
	for _, r := range results {
		if u := r.Tightest.Use; u > 0 {
			uses = append(uses, u)
			if most == nil || u > most.Tightest.Use {
				most = r
			}
		}
	}
	if len(uses) == 0 {
		return "no bucket checked"
	}
	slices.Sort(uses)
	return fmt.Sprintf("median %.2f over %d scenarios, most %.2f (seed %d: %s)", uses[len(uses)/2], len(uses), most.Tightest.Use, most.Scenario.Seed, most.Tightest)
}
