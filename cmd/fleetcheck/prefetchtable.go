package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// prefetchTable renders a case's rows, judged by js, as a Markdown table
// under a line that states the case and its targets.
func prefetchTable(c localfleet.PrefetchCase, rows []*localfleet.PrefetchRow, js []judgement) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: rate %d/s, burst %d, prefetch %d. Targets: below the rate every request admitted; above it at most %g script calls per admitted request and admitted within [%g, 1.000] of the exact bound burst + rate x elapsed; never above the bound.\n\n",
		c.Zone, c.Rate, c.Burst, c.Prefetch, c.MaxCalls, boundTarget)
	b.WriteString("| load | offered/s | achieved/s | dropped | sent late p99 | clean | requests | admitted | script calls | calls/admitted | admitted/bound | admitted/reachable |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range rows {
		j := js[i]
		clean := "yes"
		if !r.Clean {
			clean = "no"
		}
		fmt.Fprintf(&b, "| %gx | %.0f | %.0f | %d | %s | %s | %d | %s | %d | %s | %s | %.4f |\n",
			r.Load, r.Offered, r.Achieved, r.Dropped, r.LateP99.Round(100*time.Microsecond), clean,
			r.Stats.Requests, marked(fmt.Sprint(r.Stats.Admitted), j.allAdmitted), r.Calls,
			marked(fmt.Sprintf("%.4f", r.CallsPerAdmitted), j.calls),
			marked(fmt.Sprintf("%.4f", r.AdmittedBound)+over(r), j.bound),
			r.AdmittedReachable)
	}
	return b.String()
}

// marked appends a target's mark to a figure, if the figure has a target.
func marked(fig, mark string) string {
	if mark == "" {
		return fig
	}
	return fig + " (" + mark + ")"
}

// over flags a row above its exact bound.
func over(r *localfleet.PrefetchRow) string {
	if r.OverBound {
		return " ABOVE THE BOUND"
	}
	return ""
}

// prefetchNodeTable renders what each node's prefetch did in each row: the
// requests it admitted from spares and paced without Redis, its decisions
// by Redis (short: those that took fewer spares than wanted), and the
// spares it took and gave back.
func prefetchNodeTable(rows []*localfleet.PrefetchRow) string {
	var b strings.Builder
	b.WriteString("| load | node | hits | paced | decisions | short | taken | returned | refunds |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		for i, p := range r.Nodes {
			fmt.Fprintf(&b, "| %gx | %d | %d | %d | %d | %d | %d | %d | %d |\n",
				r.Load, i+1, p.Hits, p.Paced, p.Decisions, p.Short, p.Taken, p.Returned, p.Refunds)
		}
	}
	return b.String()
}
