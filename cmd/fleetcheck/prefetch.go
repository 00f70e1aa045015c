package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/progenv"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The prefetch mode's targets: the fraction of the exact bound a saturated
// key must admit, and the least script calls per admitted request a case
// given without one is held to (see caseMaxCalls).
const (
	boundTarget    = 0.97
	minCallsTarget = 0.05
)

// parseLoads reads -loads: offered loads as multiples of the rate,
// separated by commas.
func parseLoads(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || x <= 0 {
			return nil, fmt.Errorf("-loads: %q is not a positive multiple of the rate", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// parseCases reads -prefetch-case: cases RATE/BURST/PREFETCH[/MAXCALLS]
// separated by commas, named case1, case2, ... in order. A case without
// MAXCALLS gets caseMaxCalls for a fleet of nodes.
func parseCases(s string, nodes int) ([]localfleet.PrefetchCase, error) {
	var out []localfleet.PrefetchCase
	for i, f := range strings.Split(s, ",") {
		parts := strings.Split(strings.TrimSpace(f), "/")
		if len(parts) != 3 && len(parts) != 4 {
			return nil, fmt.Errorf("-prefetch-case: %q is not RATE/BURST/PREFETCH[/MAXCALLS]", f)
		}
		var n [3]int64
		for j := range n {
			v, err := strconv.ParseInt(parts[j], 10, 64)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("-prefetch-case: %q: %q is not a positive integer", f, parts[j])
			}
			n[j] = v
		}
		c := localfleet.PrefetchCase{Zone: fmt.Sprintf("case%d", i+1), Rate: n[0], Burst: n[1], Prefetch: n[2]}
		c.MaxCalls = caseMaxCalls(c.Prefetch, nodes)
		if len(parts) == 4 {
			v, err := strconv.ParseFloat(parts[3], 64)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("-prefetch-case: %q: %q is not a positive number of calls per admitted request", f, parts[3])
			}
			c.MaxCalls = v
		}
		out = append(out, c)
	}
	return out, nil
}

// caseMaxCalls is the calls per admitted request a case with prefetch n is
// held to on a fleet of nodes nodes: where the pacing settles a saturated
// key, (nodes + 1) / n (docs/policies.md, "The lower bound"), and never
// below 0.05. For three nodes: 0.05 with prefetch 100, 0.2 with 20.
func caseMaxCalls(n int64, nodes int) float64 {
	return max(minCallsTarget, float64(nodes+1)/float64(n))
}

// judgement is a row against its case's targets.
type judgement struct {
	// allAdmitted, calls and bound are "met" or "not met" for the targets
	// the row's load has ("" for the others): below the rate every
	// request admitted; above it at most MaxCalls script calls per
	// admitted request, and the admitted tokens within [0.97, 1] of the
	// exact bound.
	allAdmitted, calls, bound string
	// failures are what makes the run fail: the bound broken, requests
	// that failed or failed open (the bound cannot be checked), and
	// targets missed on a clean run.
	failures []string
	// excused are the targets missed on a run that was not clean.
	excused []string
}

// judge checks a row against its case's targets.
func judge(r *localfleet.PrefetchRow) judgement {
	var j judgement
	name := fmt.Sprintf("%s at %gx", r.Case.Zone, r.Load)
	if r.OverBound {
		j.failures = append(j.failures, fmt.Sprintf("%s: admitted %d tokens, above the exact bound %.2f", name, r.Bucket.Tokens, r.Bucket.Bound))
	}
	s := r.Stats
	if s.Errors > 0 || s.FailedOpen > 0 {
		j.failures = append(j.failures, fmt.Sprintf("%s: %d errors %v, %d requests failed open: the bound cannot be checked", name, s.Errors, s.ErrorKinds, s.FailedOpen))
	}
	if s.Requests == 0 {
		j.failures = append(j.failures, name+": no request was answered")
	}
	miss := func(what string) {
		if r.Clean {
			j.failures = append(j.failures, name+": "+what)
		} else {
			j.excused = append(j.excused, name+": "+what+" (the run was not clean)")
		}
	}
	mark := func(ok bool, what string) string {
		if ok {
			return "met"
		}
		miss(what)
		return "not met"
	}
	switch {
	case r.Load < 1:
		j.allAdmitted = mark(r.AllAdmitted(), fmt.Sprintf("admitted %d of %d requests below the rate, want all", s.Admitted, s.Requests))
	case r.Load > 1:
		j.calls = mark(r.CallsPerAdmitted <= r.Case.MaxCalls,
			fmt.Sprintf("%.4f script calls per admitted request, want at most %g", r.CallsPerAdmitted, r.Case.MaxCalls))
		if r.OverBound {
			j.bound = "not met" // a failure already
		} else {
			j.bound = mark(r.AdmittedBound >= boundTarget,
				fmt.Sprintf("admitted %.4f of the exact bound, want at least %g", r.AdmittedBound, boundTarget))
		}
	}
	return j
}

// runPrefetch is the prefetch mode: a fleet of nodeCount nodes serving the
// cases, each case run at each load for d. It prints a table per case and
// returns the exit code: 1 if a bound broke or a clean run missed a target.
func runPrefetch(env *progenv.Env, nodeCount int, d time.Duration, loads []float64, cases []localfleet.PrefetchCase) int {
	fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
	bin, err := localfleet.BuildCaddy(env.TempDir())
	if err != nil {
		env.Fatal(err)
	}
	r := redistest.Start(env)
	site := localfleet.PrefetchSite(redisBlock(r.Addr), cases)
	nodes := make([]*localfleet.Node, nodeCount)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i] = localfleet.StartNode(env, bin, "", site) })
	}
	wg.Wait()
	fmt.Fprintf(os.Stderr, "redis on %s; %d caddy nodes:", r.Addr, nodeCount)
	for _, n := range nodes {
		fmt.Fprintf(os.Stderr, " %s", n.URL)
		_, _ = n.Do("GET", "/"+cases[0].Zone) // a node joins the fleet view once it decided
	}
	fmt.Fprintln(os.Stderr, "\nwaiting for every node to count the fleet ...")
	if err := localfleet.WaitFleetView(nodes, nodeCount, 20*time.Second); err != nil {
		env.Fatal(err)
	}

	fmt.Printf("%d nodes, one Redis; one zone per case with `key global`; HTTP requests started on a schedule (open loop), %s per load\n\n", nodeCount, d)
	var failures, excused []string
	for _, c := range cases {
		var rows []*localfleet.PrefetchRow
		var js []judgement
		for _, x := range loads {
			fmt.Fprintf(os.Stderr, "%s at %gx the rate ...\n", c, x)
			row, err := localfleet.RunPrefetch(context.Background(), nodes, r, c, x, d)
			if err != nil {
				env.Fatal(err)
			}
			fmt.Fprintln(os.Stderr, row)
			j := judge(row)
			rows, js = append(rows, row), append(js, j)
			failures, excused = append(failures, j.failures...), append(excused, j.excused...)
		}
		fmt.Println(prefetchTable(c, rows, js))
		fmt.Println(prefetchNodeTable(rows))
	}
	for _, e := range excused {
		fmt.Println("NOT CLEAN:", e)
	}
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Println("FAIL:", f)
		}
		return 1
	}
	fmt.Println("PASS: no key above its bound; every clean run met its targets.")
	return 0
}
