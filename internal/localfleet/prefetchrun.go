package localfleet

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// PrefetchCase is one prefetching zone with one key shared by every request
// (`key global`), the way a hot key meets a fleet, and the most script
// calls per admitted request it may make above its rate.
type PrefetchCase struct {
	// Zone names the zone; its requests go to the path /Zone.
	Zone string
	// Rate is the zone's tokens a second.
	Rate int64
	// Burst is the most tokens the bucket holds.
	Burst int64
	// Prefetch is the most tokens a node takes in one script call.
	Prefetch int64
	// MaxCalls is the target of script calls per admitted request at
	// loads above the rate.
	MaxCalls float64
}

// PrefetchCases are the two cases prefetch's targets are set for, as a
// shared 2-core machine can offer them over HTTP: 5,000/s, burst 500,
// prefetch 100 stands for 20,000/s, burst 2,000, prefetch 100 (the same
// prefetch, which the calls per admitted request follow, and a burst of a
// tenth of a second, above 4 x 100 so that a call can take all its
// spares); 2,000/s, burst 200, prefetch 20 runs as it is.
func PrefetchCases() []PrefetchCase {
	return []PrefetchCase{
		{Zone: "hot", Rate: 5000, Burst: 500, Prefetch: 100, MaxCalls: 0.05},
		{Zone: "warm", Rate: 2000, Burst: 200, Prefetch: 20, MaxCalls: 0.2},
	}
}

// String names the case's rule.
func (c PrefetchCase) String() string {
	return fmt.Sprintf("%s (rate %d/s burst %d prefetch %d)", c.Zone, c.Rate, c.Burst, c.Prefetch)
}

// refill is how long the rate takes to fill the burst.
func (c PrefetchCase) refill() time.Duration {
	return time.Duration(float64(time.Second) * float64(c.Burst) / float64(c.Rate))
}

// PrefetchSite returns the site block of a fleet serving the cases: a
// rate_limit handler with the store block store (`redis { ... }`) and one
// zone per case, matched by the path /Zone, before `respond "ok"`.
func PrefetchSite(store string, cases []PrefetchCase) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n\trate_limit {\n\t\t%s", store)
	for _, c := range cases {
		fmt.Fprintf(&b, `
		zone %s {
			key global
			rate %d 1s
			burst %d
			prefetch %d
			match {
				path /%s
			}
		}`, c.Zone, c.Rate, c.Burst, c.Prefetch, c.Zone)
	}
	b.WriteString("\n\t}\n\trespond \"ok\"")
	return b.String()
}

// PrefetchRow is one case run at one load: what the fleet was offered and
// admitted, and what it asked Redis for it.
type PrefetchRow struct {
	// OpenReport is the open-loop run: offered and achieved rates, due
	// and dropped requests, how late they went out.
	*OpenReport
	// Case is the case run.
	Case PrefetchCase
	// Load is the offered load as a multiple of the case's rate.
	Load float64
	// Stats is what happened to the requests: answered, admitted,
	// errors, failed open.
	Stats *TargetStats
	// Bucket is the key's admissions against the exact bound.
	Bucket *BucketStats
	// Calls counts the script calls Redis ran during the run (decisions,
	// prefetches and refunds); CallsPerAdmitted is Calls over the
	// admitted requests (over 1 when none was).
	Calls            int64
	CallsPerAdmitted float64
	// AdmittedBound is the admitted tokens over the exact bound burst +
	// rate x elapsed; AdmittedReachable those over what the fleet could
	// reach given when the requests went out (BucketStats.Reachable).
	AdmittedBound, AdmittedReachable float64
	// OverBound reports that the fleet admitted more than the exact
	// bound: never acceptable.
	OverBound bool
	// Clean reports that the load went out as scheduled: no request
	// dropped, and the 99th percentile late by at most half the time the
	// rate takes to refill the burst. A run that is not clean offered
	// less than it was meant to, so the lower bounds say little of it.
	Clean bool
	// Nodes are what each node's prefetch did for the zone during the
	// run (the stats endpoint's prefetch), indexed like the nodes.
	Nodes []limiter.PrefetchStats
}

// AllAdmitted reports that the fleet admitted every request it answered,
// without errors or failures open.
func (r *PrefetchRow) AllAdmitted() bool {
	return r.Stats.Errors == 0 && r.Stats.FailedOpen == 0 && r.Stats.Admitted == r.Stats.Requests
}

// String describes the row in one line.
func (r *PrefetchRow) String() string {
	return fmt.Sprintf("%s at %.2fx: %s; %d script calls, %.4f per admitted; admitted/bound %.4f, admitted/reachable %.4f; clean %v; nodes' prefetch: %+v",
		r.Case, r.Load, r.OpenReport, r.Calls, r.CallsPerAdmitted, r.AdmittedBound, r.AdmittedReachable, r.Clean, r.Nodes)
}

// prefetchSettle is the least rest a zone gets before a run: the bucket
// refills and the nodes' spares go back.
const prefetchSettle = 600 * time.Millisecond

// RunPrefetch loads the case's zone on nodes, which serve PrefetchSite's
// zones with the Redis r, in open loop at load times its rate for d (256
// requests in flight per node at most), and returns what it measured. It
// first lets the zone rest, so that the bucket starts full and no node
// holds spares: at least 600 ms, more if the burst takes longer to refill.
// The nodes should have joined the fleet view (WaitFleetView). It fails
// only if Redis or a node's stats cannot be read.
func RunPrefetch(ctx context.Context, nodes []*Node, r *redistest.Server, c PrefetchCase, load float64, d time.Duration) (*PrefetchRow, error) {
	time.Sleep(max(prefetchSettle, c.refill()+2*limiter.DefaultPrefetchHold))
	b := &Bucket{Zone: c.Zone, Key: "global", Rate: c.Rate, Per: time.Second, Burst: c.Burst, Saturated: load > 1}
	tg := &Target{Name: c.Zone, Path: "/" + c.Zone, Cost: 1, Buckets: []*Bucket{b}}
	calls0, err := ScriptCalls(r)
	if err != nil {
		return nil, err
	}
	pf0, err := ZonePrefetch(nodes, c.Zone)
	if err != nil {
		return nil, err
	}
	rep := RunOpen(ctx, OpenLoad{Nodes: nodes, Target: tg, Rate: load * float64(c.Rate), Duration: d, InFlight: 256})
	calls, err := ScriptCalls(r)
	if err != nil {
		return nil, err
	}
	pf, err := ZonePrefetch(nodes, c.Zone)
	if err != nil {
		return nil, err
	}
	for i := range pf {
		pf[i] = pf[i].Minus(pf0[i])
	}
	return prefetchRow(rep, c, load, calls-calls0, pf), nil
}

// prefetchRow computes the row of case c's run rep at load, with calls
// script calls and the nodes' prefetch stats pf.
func prefetchRow(rep *OpenReport, c PrefetchCase, load float64, calls int64, pf []limiter.PrefetchStats) *PrefetchRow {
	row := &PrefetchRow{OpenReport: rep, Case: c, Load: load, Stats: rep.Targets[rep.target], Calls: calls, Nodes: pf}
	if row.Stats == nil || len(rep.Buckets) == 0 {
		// Nothing was answered: nothing admitted, against the burst.
		row.Stats = newTargetStats(len(pf))
		b := rep.target.Buckets[0]
		row.Bucket = &BucketStats{Bucket: b, Bound: float64(b.Burst), Reachable: float64(b.Burst), PerNode: make([]int64, len(pf))}
	} else {
		row.Bucket = rep.Buckets[0]
	}
	bs := row.Bucket
	row.CallsPerAdmitted = float64(row.Calls) / float64(max(bs.Tokens, 1))
	row.AdmittedBound = float64(bs.Tokens) / bs.Bound
	row.AdmittedReachable = float64(bs.Tokens) / max(bs.Reachable, 1)
	// The bound is in tokens and an admitted total is whole: only the
	// bound's whole part can be reached.
	row.OverBound = float64(bs.Tokens) > math.Floor(bs.Bound+1e-9)
	row.Clean = rep.Dropped == 0 && rep.LateP99 <= c.refill()/2
	return row
}
