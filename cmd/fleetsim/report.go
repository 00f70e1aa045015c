package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// describe states a simulation's set-up in one paragraph.
func describe(c config) string {
	load := fmt.Sprintf("%d workers each (closed loop)", c.Workers)
	if c.Rate > 0 {
		load = fmt.Sprintf("%.0f requests/s offered (open loop, at most %d in flight per node)", c.Rate, c.Workers)
	}
	var zones []string
	if c.Global {
		zones = append(zones, fmt.Sprintf("global (key global) %d/s burst %d%s", c.GlobalLimit.rate, c.GlobalLimit.burst, prefetchNote(c.GlobalPrefetch, c.PrefetchHold)))
	}
	if c.Client {
		zones = append(zones, fmt.Sprintf("client %d/s burst %d per key%s", c.ClientLimit.rate, c.ClientLimit.burst, prefetchNote(c.ClientPrefetch, c.PrefetchHold)))
	}
	return fmt.Sprintf("fleetsim: %d nodes, %s; %d client keys, Zipf s=%g; zones: %s; %s per run; store timeout %s, pipelines %d",
		c.Nodes, load, c.Keys, c.ZipfS, strings.Join(zones, ", "), c.Duration, c.Timeout, c.Pipelines)
}

// prefetchNote describes a zone's prefetch, "" when it has none.
func prefetchNote(n int64, hold time.Duration) string {
	switch {
	case n == 0:
		return ""
	case hold == 0:
		return fmt.Sprintf(" prefetch %d", n)
	}
	return fmt.Sprintf(" prefetch %d hold %s", n, hold)
}

func perSecond(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() }

// ratio returns a/b, NaN when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// column is one figure of the summary table.
type column struct {
	name   string
	digits int
	value  func(r *result) float64
}

// summaryColumns are the figures of one run. A decision is one request's
// (all its zones'); "to Redis" are those that the deny caches (and a
// prefetch) did not answer.
var summaryColumns = []column{
	{"requests/s", 0, func(r *result) float64 { return perSecond(r.Requests, r.Elapsed) }},
	{"admitted %", 1, func(r *result) float64 { return 100 * ratio(float64(r.Admitted), float64(r.Requests)) }},
	{"to Redis/s", 0, func(r *result) float64 { return perSecond(r.StoreCalls, r.Elapsed) }},
	{"without Redis %", 1, func(r *result) float64 {
		return 100 * ratio(float64(r.Requests-r.StoreCalls), float64(r.Requests))
	}},
	{"deny cache %", 1, func(r *result) float64 { return 100 * ratio(float64(r.CacheHits), float64(r.Requests)) }},
	{"prefetch hits %", 1, func(r *result) float64 {
		if !r.Prefetch {
			return math.NaN()
		}
		return 100 * ratio(float64(r.PrefetchHits), float64(r.Requests))
	}},
	{"EVALSHA/s", 0, func(r *result) float64 { return perSecond(r.Redis.EvalshaCalls, r.Elapsed) }},
	{"decisions/EVALSHA", 2, func(r *result) float64 { return ratio(float64(r.StoreCalls), float64(r.Redis.EvalshaCalls)) }},
	{"round trips/s", 0, func(r *result) float64 { return perSecond(r.Redis.Reads, r.Elapsed) }},
	{"decisions/round trip", 2, func(r *result) float64 { return ratio(float64(r.StoreCalls), float64(r.Redis.Reads)) }},
	{"Redis CPU us/decision", 2, func(r *result) float64 { return 1e6 * ratio(r.Redis.CPU, float64(r.StoreCalls)) }},
	{"script us/decision", 2, func(r *result) float64 { return ratio(float64(r.Redis.EvalshaUsec), float64(r.StoreCalls)) }},
	{"decisions/s per Redis core", 0, func(r *result) float64 { return ratio(float64(r.StoreCalls), r.Redis.CPU) }},
	{"ceiling decisions/s (busiest master at 100%)", 0, func(r *result) float64 {
		busiest := 0.0
		for _, m := range r.Masters {
			busiest = max(busiest, m.CPU)
		}
		return ratio(float64(r.StoreCalls), busiest)
	}},
	{"Redis CPU % (all masters)", 0, func(r *result) float64 { return 100 * r.Redis.CPU / r.Elapsed.Seconds() }},
	{"sim CPU us/request", 1, func(r *result) float64 { return ratio(float64(r.SimCPU.Microseconds()), float64(r.Requests)) }},
	{"sim idle CPU %", 0, func(r *result) float64 { return 100 * r.IdleCPU }},
	{"failed", 0, func(r *result) float64 { return float64(r.Failed) }},
	{"over-admitted tokens", 0, func(r *result) float64 { return float64(r.OverAdmitted()) }},
}

// format renders v with digits decimals, "n/a" for NaN.
func format(v float64, digits int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', digits, 64)
}

// median returns the median of vs, ignoring NaN (NaN when none is left).
func median(vs []float64) float64 {
	vs = slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// table renders a Markdown table.
func table(head []string, rows [][]string) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for i := range head {
		if i == 0 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String()
}

// summaryTable has a row per run, and their medians when there are several.
func summaryTable(rs []*result) string {
	head := []string{"run", "seconds"}
	for _, c := range summaryColumns {
		head = append(head, c.name)
	}
	var rows [][]string
	cols := make([][]float64, len(summaryColumns))
	for i, r := range rs {
		row := []string{strconv.Itoa(i + 1), format(r.Elapsed.Seconds(), 2)}
		for j, c := range summaryColumns {
			v := c.value(r)
			cols[j] = append(cols[j], v)
			row = append(row, format(v, c.digits))
		}
		rows = append(rows, row)
	}
	if len(rs) > 1 {
		row := []string{"median", ""}
		for j, c := range summaryColumns {
			row = append(row, format(median(cols[j]), c.digits))
		}
		rows = append(rows, row)
	}
	return table(head, rows)
}

// classTable has, per run, a row per class of client keys and one for the
// global bucket.
func classTable(rs []*result) string {
	head := []string{"run", "zone", "class (ranks)", "keys", "requests", "eligible", "admitted", "reachable", "admitted/reachable", "keys over bound", "tokens over bound"}
	var rows [][]string
	for i, r := range rs {
		cs := slices.Clone(r.Classes)
		if r.Global != nil {
			cs = append(cs, *r.Global)
		}
		for _, c := range cs {
			zone, class := "client", fmt.Sprintf("%s (%d-%d)", c.Name, c.Lo+1, c.Hi)
			if c.Name == "global" {
				zone, class = "global", "the one key"
			}
			rows = append(rows, []string{
				strconv.Itoa(i + 1), zone, class, strconv.Itoa(c.Keys),
				strconv.FormatInt(c.Offered, 10), strconv.FormatInt(c.Eligible, 10), strconv.FormatInt(c.Admitted, 10),
				strconv.FormatInt(c.Reachable, 10), format(c.Ratio(), 4), strconv.Itoa(c.Over), strconv.FormatInt(c.Excess, 10),
			})
		}
	}
	return "Admissions per class of keys (eligible: not denied by the other zone; reachable: per key min(eligible, burst + rate x elapsed)):\n\n" + table(head, rows)
}

// masterTable has, per run, a row per Cluster master.
func masterTable(rs []*result) string {
	head := []string{"run", "master", "global bucket", "EVALSHA/s", "round trips/s", "CPU %", "CPU us/EVALSHA", "script us/EVALSHA"}
	var rows [][]string
	for i, r := range rs {
		for _, m := range r.Masters {
			g := ""
			if m.Addr == r.GlobalMaster {
				g = "here"
			}
			rows = append(rows, []string{
				strconv.Itoa(i + 1), m.Addr, g,
				format(perSecond(m.EvalshaCalls, r.Elapsed), 0), format(perSecond(m.Reads, r.Elapsed), 0),
				format(100*m.CPU/r.Elapsed.Seconds(), 0),
				format(1e6*ratio(m.CPU, float64(m.EvalshaCalls)), 2), format(ratio(float64(m.EvalshaUsec), float64(m.EvalshaCalls)), 2),
			})
		}
	}
	return "Per master:\n\n" + table(head, rows)
}
