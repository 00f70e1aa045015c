package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// report is a benchmark's results and how they were measured.
type report struct {
	Machine  machine
	Pinning  string // how the processes were pinned, as printed
	Args     string // the command line's arguments
	Rounds   int
	Duration time.Duration // measured load per configuration and round
	Warmup   time.Duration // unmeasured load before each measurement
	Threads  int           // wrk threads
	// MaxForeign is the disturbance threshold: the percent of a benchmark
	// CPU other processes may use before a run is repeated.
	MaxForeign float64
	Retries    int                  // repeats of a disturbed run at most
	Configs    []config             // in the order they ran
	Samples    map[string][]*sample // by configuration name, one per round
	// RedisAlone is Redis' time per decision with Redis alone on a CPU
	// (see bench.redisAlone).
	RedisAlone []aloneResult `json:",omitempty"`
	Profiles   []*profileResult
}

// column is one figure of the median table: get returns it for one run,
// false when the run has none.
type column struct {
	head   string
	get    func(c config, s *sample) (float64, bool)
	format string
}

func perRequest(s *sample, v float64) float64 { return v / float64(max(s.Wrk.Requests, 1)) }

var columns = []column{
	{"req/s", func(_ config, s *sample) (float64, bool) { return s.Wrk.RPS(), true }, "%.0f"},
	{"x plain", func(_ config, s *sample) (float64, bool) { return s.Ratio, s.Ratio > 0 }, "%.3f"},
	{"x plain (CPU)", func(_ config, s *sample) (float64, bool) { return s.CPURatio, s.CPURatio > 0 }, "%.3f"},
	{"x fair (CPU)", func(c config, s *sample) (float64, bool) {
		return s.FairCPURatio, c.Store != "plain" && c.Sc.fair() != c.Sc.Ref && s.FairCPURatio > 0
	}, "%.3f"},
	{"p50 ms", func(_ config, s *sample) (float64, bool) { return ms(s.Wrk.P50), true }, "%.3f"},
	{"p99 ms", func(_ config, s *sample) (float64, bool) { return ms(s.Wrk.P99), true }, "%.3f"},
	{"p99.9 ms", func(_ config, s *sample) (float64, bool) { return ms(s.Wrk.P999), true }, "%.3f"},
	{"p99 added ms", func(c config, s *sample) (float64, bool) { return ms(s.P99Added), c.Store != "plain" && s.Ratio > 0 }, "%+.3f"},
	{"non-2xx %", func(_ config, s *sample) (float64, bool) { return pct(s.Wrk.Status, s.Wrk.Requests), true }, "%.1f"},
	{"Caddy CPU us/req", func(_ config, s *sample) (float64, bool) { return perRequest(s, us(s.CaddyCPU)), true }, "%.1f"},
	{"Caddy peak RSS MiB", func(_ config, s *sample) (float64, bool) { return float64(s.RSSKB) / 1024, true }, "%.1f"},
	{"Redis us/decision", func(_ config, s *sample) (float64, bool) {
		if s.Redis == nil || s.Redis.Decisions == 0 {
			return 0, false
		}
		return float64(s.Redis.Usec) / float64(s.Redis.Decisions), true
	}, "%.2f"},
	{"EVALSHA/req", func(_ config, s *sample) (float64, bool) {
		if s.Redis == nil {
			return 0, false
		}
		return perRequest(s, float64(s.Redis.Calls)), true
	}, "%.3f"},
	{"round trips/req", func(_ config, s *sample) (float64, bool) {
		if s.Redis == nil {
			return 0, false
		}
		return perRequest(s, float64(s.Redis.Reads)), true
	}, "%.3f"},
	{"Redis CPU us/req", func(_ config, s *sample) (float64, bool) {
		if s.Redis == nil {
			return 0, false
		}
		return perRequest(s, s.Redis.CPU*1e6), true
	}, "%.1f"},
}

// memColumns are the Redis memory figures of the runs with many keys.
var memColumns = []column{
	{"buckets (DBSIZE)", func(_ config, s *sample) (float64, bool) { return float64(s.Redis.DBSize), true }, "%.0f"},
	{"used_memory delta B", func(_ config, s *sample) (float64, bool) { return float64(s.Redis.MemDelta), true }, "%.0f"},
	{"bytes/bucket (delta/DBSIZE)", func(_ config, s *sample) (float64, bool) {
		return float64(s.Redis.MemDelta) / float64(s.Redis.DBSize), true
	}, "%.1f"},
	{"MEMORY USAGE of one bucket", func(_ config, s *sample) (float64, bool) {
		return float64(s.Redis.KeyUsage), s.Redis.KeyUsage > 0
	}, "%.0f"},
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// med returns the median of a column over a configuration's rounds.
func (r *report) med(c config, col column) (float64, bool) {
	var v []float64
	for _, s := range r.Samples[c.Name()] {
		if x, ok := col.get(c, s); ok && !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	return median(v), true
}

func (r *report) cell(c config, col column) string {
	v, ok := r.med(c, col)
	if !ok {
		return "—"
	}
	return fmt.Sprintf(col.format, v)
}

func (r *report) find(store, scenarioID string) (config, bool) {
	for _, c := range r.Configs {
		if c.Store == store && c.Sc.ID == scenarioID {
			return c, true
		}
	}
	return config{}, false
}

func (r *report) medianTable() string {
	var b strings.Builder
	b.WriteString("| configuration | conns |")
	for _, col := range columns {
		b.WriteString(" " + col.head + " |")
	}
	b.WriteString("\n|---|---:|")
	for range columns {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, c := range r.Configs {
		fmt.Fprintf(&b, "| %s | %d |", c.Name(), c.Sc.Conns)
		for _, col := range columns {
			b.WriteString(" " + r.cell(c, col) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (r *report) memoryTable() string {
	var b strings.Builder
	b.WriteString("| configuration |")
	for _, col := range memColumns {
		b.WriteString(" " + col.head + " |")
	}
	b.WriteString("\n|---|")
	for range memColumns {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, c := range r.Configs {
		if c.Store != "redis" || c.Sc.Keys == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s |", c.Name())
		for _, col := range memColumns {
			b.WriteString(" " + r.cell(c, col) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (r *report) roundsTable() string {
	var b strings.Builder
	b.WriteString("| round | configuration | req/s | x plain | p50 ms | p99 ms | p99.9 ms | non-2xx | socket errors | Caddy CPU us/req | peak RSS MiB | wrk CPU % | Redis CPU % | steal % | foreign % Caddy CPU / load CPU | attempts | store failures |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for round := 1; round <= r.Rounds; round++ {
		for _, c := range r.Configs {
			ss := r.Samples[c.Name()]
			if round > len(ss) {
				continue
			}
			s := ss[round-1]
			ratio, rcpu := "—", "—"
			if c.Store != "plain" && s.Ratio > 0 {
				ratio = fmt.Sprintf("%.3f", s.Ratio)
			}
			secs := s.Wrk.Duration.Seconds()
			if s.Redis != nil && secs > 0 {
				rcpu = fmt.Sprintf("%.0f", 100*s.Redis.CPU/secs)
			}
			wcpu := "—"
			if secs > 0 {
				wcpu = fmt.Sprintf("%.0f", 100*s.Wrk.CPU.Seconds()/secs)
			}
			fails := "0"
			if s.FailWarnings > 0 {
				fails = fmt.Sprintf("%d warnings, total %d", s.FailWarnings, s.FailTotal)
			}
			fmt.Fprintf(&b, "| %d | %s | %.0f | %s | %.3f | %.3f | %.3f | %d | %d | %.1f | %.1f | %s | %s | %.1f | %.0f / %.0f | %d | %s |\n",
				round, c.Name(), s.Wrk.RPS(), ratio, ms(s.Wrk.P50), ms(s.Wrk.P99), ms(s.Wrk.P999),
				s.Wrk.Status, s.Wrk.SockErrors, perRequest(s, us(s.CaddyCPU)), float64(s.RSSKB)/1024, wcpu, rcpu, s.StealPct,
				s.ForeignCaddy, s.ForeignLoad, s.Attempts, fails)
		}
	}
	return b.String()
}

// target is one of the performance issue's goals, checked against the
// medians.
type target struct {
	what  string
	value string
	met   bool
	known bool
}

// goal is one of the performance issue's goals: a bound on the median of
// the column headed head, checked in each scenario for each store (or, with
// alone, on Redis' time per decision with Redis alone on a CPU).
type goal struct {
	what   string
	scs    []string
	stores []string
	head   string
	alone  bool
	ok     func(float64) bool
}

func atLeast(min float64) func(float64) bool { return func(v float64) bool { return v >= min } }
func atMost(max float64) func(float64) bool  { return func(v float64) bool { return v <= max } }

// goals are the performance issue's goals, in the order they are reported.
// The ratios are by Caddy's CPU time per request (throughput on a
// saturated CPU, less sensitive to a noisy neighbour than req/s). A denial
// costs at most what a static 429 with the same fields costs: the static
// 429's CPU per request over the denial's >= 1.
var goals = []goal{
	{"Redis store >= 0.80x plain (CPU per request)", []string{"hot", "keys"}, []string{"redis"}, "x plain (CPU)", false, atLeast(0.80)},
	{"memory store >= 0.95x plain (CPU per request)", []string{"hot", "keys"}, []string{"memory"}, "x plain (CPU)", false, atLeast(0.95)},
	{"memory store >= 0.97x plain with the same fields (CPU per request)", []string{"hot", "keys"}, []string{"memory"}, "x fair (CPU)", false, atLeast(0.97)},
	{"memory store, headers none >= 0.97x plain (CPU per request)", []string{"bare"}, []string{"memory"}, "x plain (CPU)", false, atLeast(0.97)},
	{"denial <= 1.0x the CPU of a static 429 (x fair >= 1.0)", []string{"deny", "ban"}, []string{"memory", "redis"}, "x fair (CPU)", false, atLeast(1.0)},
	{"p99 added <= 0.3 ms", []string{"hot", "keys", "light"}, []string{"memory", "redis"}, "p99 added ms", false, atMost(0.3)},
	{"Redis <= 3 us server time per decision (Redis sharing its CPU with wrk)", []string{"hot", "keys"}, []string{"redis"}, "Redis us/decision", false, atMost(3)},
	{"Redis <= 3 us server time per decision (Redis alone on a CPU)", nil, nil, "", true, atMost(3)},
	{"<= 80 bytes per bucket (used_memory delta / DBSIZE)", []string{"keys"}, []string{"redis"}, "bytes/bucket (delta/DBSIZE)", false, atMost(80)},
	{"<= 80 bytes per bucket (MEMORY USAGE)", []string{"keys"}, []string{"redis"}, "MEMORY USAGE of one bucket", false, atMost(80)},
	{"round trips per request well below 1 (< 0.5)", []string{"hot", "keys"}, []string{"redis"}, "round trips/req", false, func(v float64) bool { return v < 0.5 }},
}

// targets checks every goal against the medians.
func (r *report) targets() []target {
	var t []target
	for _, g := range goals {
		if g.alone {
			t = append(t, r.aloneTargets(g)...)
			continue
		}
		for _, sc := range g.scs {
			for _, store := range g.stores {
				if tg, ok := r.target(g, store, sc); ok {
					t = append(t, tg)
				}
			}
		}
	}
	return t
}

// target checks goal g on the store's configuration of scenario sc, if the
// run had that configuration.
func (r *report) target(g goal, store, sc string) (target, bool) {
	c, present := r.find(store, sc)
	if !present {
		return target{}, false
	}
	col := columnHeaded(g.head)
	v, found := r.med(c, col)
	if !found {
		return target{what: g.what, value: "not measured"}, true
	}
	value := fmt.Sprintf("%s: "+col.format, c.Name(), v)
	switch g.head {
	case "x plain (CPU)":
		if byRPS, ok := r.med(c, columnHeaded("x plain")); ok {
			value += fmt.Sprintf(" (by req/s: %.3f)", byRPS)
		}
	case "x fair (CPU)":
		if f, ok := r.find("plain", c.Sc.fair()); ok {
			value += " against " + f.Name()
		}
	}
	return target{what: g.what, value: value, met: g.ok(v), known: true}, true
}

// aloneTargets checks goal g on each configuration measured with Redis
// alone on a CPU.
func (r *report) aloneTargets(g goal) []target {
	var t []target
	for _, a := range r.RedisAlone {
		if len(a.USPerDec) > 0 {
			v := median(a.USPerDec)
			t = append(t, target{what: g.what, value: fmt.Sprintf("%s: %.2f", a.Config, v), met: g.ok(v), known: true})
		}
	}
	return t
}

// columnHeaded returns the column of the tables headed head.
func columnHeaded(head string) column {
	for _, c := range slices.Concat(columns, memColumns) {
		if c.head == head {
			return c
		}
	}
	panic("no column " + head)
}

func (r *report) targetsText() string {
	var b strings.Builder
	for _, t := range r.targets() {
		mark := "NOT MET"
		switch {
		case !t.known:
			mark = "n/a"
		case t.met:
			mark = "met"
		}
		fmt.Fprintf(&b, "- %s — %s — **%s**\n", t.what, t.value, mark)
	}
	return b.String()
}

func (r *report) header() string {
	m := r.Machine
	var b strings.Builder
	fmt.Fprintf(&b, "Command: `go run ./cmd/bench %s`\n\n", r.Args)
	fmt.Fprintf(&b, "Machine: %d CPUs (nproc %s), %s; %s; Linux %s; load average at start %s; %s; %s.\n\n",
		m.NumCPU, m.Allowed, m.CPUModel, m.GoVersion, m.Kernel, m.LoadAvg, m.Wrk, m.Redis)
	fmt.Fprintf(&b, "Code: %s.\n\n", m.Code)
	fmt.Fprintf(&b, "Pinning: %s. Caddy's GOMAXPROCS follows its CPU set.\n\n", r.Pinning)
	fmt.Fprintf(&b, "Method:\n\n")
	fmt.Fprintf(&b, "- %d rounds; each round runs every configuration once, in the order of the table, on a fresh Caddy (admin off, "+
		"its output to a log file) and, for Redis, an emptied database: %s of unmeasured load, then %s measured with `wrk -t %d`. "+
		"Figures are medians over the rounds.\n", r.Rounds, r.Warmup, r.Duration, r.Threads)
	fmt.Fprintf(&b, "- \"x plain\" and \"p99 added\" compare each run with the plain Caddy run of the same round and load (the denial "+
		"runs with plain Caddy on the hot key). \"x plain (CPU)\" is plain Caddy's CPU time per request over the configuration's: "+
		"the throughput ratio if only Caddy's CPU counted, less sensitive to a noisy neighbour. \"x fair (CPU)\" is the same "+
		"against the run's fair baseline in the same round: plain Caddy sending the same response without the limiter, i.e. "+
		"the five rate limit fields set by the `header` directive for admitted requests, and `respond 429` with the same "+
		"fields and Retry-After for denied and banned ones; above 1.0 the limiter's response costs less than the static one.\n")
	fmt.Fprintf(&b, "- At %d connections Caddy's CPU is saturated and latency is mostly queueing; the light-load rows (%s) show the "+
		"latency the handler adds to a request.\n", r.conns(), r.lightLabel())
	fmt.Fprintf(&b, "- Rules: nothing denied `rate 1000 1h burst 100000000` (every bucket lives for the whole run); most denied "+
		"`rate 100 1s`; banned `rate 100 1s` with `ban 1h after 10 in 1m` (the warm-up starts the ban). Zone key "+
		"`{header.X-Key}`; wrk sends `X-Key: hot`, or one of the keys at random. No `handle_errors`: denials are written "+
		"by the handler (see docs/performance.md).\n")
	fmt.Fprintf(&b, "- Redis: server time per decision from INFO commandstats after CONFIG RESETSTAT: `cmdstat_evalsha` usec over "+
		"the decisions sent to Redis, from Caddy's metrics (the count of `caddy_rate_limit_store_duration_seconds`; the "+
		"decisions waiting together share one EVALSHA); "+
		"round trips from the `total_reads_processed` delta (one read event per pipeline round trip) over requests; CPU from "+
		"`used_cpu_user` + `used_cpu_sys`; bytes per bucket: `used_memory` from the emptied database to the end of the run "+
		"(Caddy stopped, so no client buffers) over DBSIZE, and MEMORY USAGE of one bucket.\n")
	fmt.Fprintf(&b, "- Caddy CPU: utime + stime of the process over the measured requests; peak RSS: VmHWM. Steal: /proc/stat steal "+
		"time of Caddy's CPU. Foreign: CPU time other processes took on Caddy's CPU and on the load CPU during the run (the "+
		"CPU's busy time less Caddy's, or less wrk's and Redis'; an estimate within a few percent); a run with more than %.0f%% "+
		"is run again, up to %d more times, and the least disturbed one is kept.\n\n", r.MaxForeign, r.Retries)
	return b.String()
}

// conns is the connections of the main load.
func (r *report) conns() int {
	for _, c := range r.Configs {
		if c.Sc.ID != "light" {
			return c.Sc.Conns
		}
	}
	return 0
}

func (r *report) lightLabel() string {
	for _, c := range r.Configs {
		if c.Sc.ID == "light" {
			return c.Sc.Label
		}
	}
	return "none in this run"
}

func (r *report) markdown() string {
	var b strings.Builder
	b.WriteString("# fleetlimit benchmark\n\n")
	b.WriteString(r.header())
	b.WriteString("## Medians\n\n")
	b.WriteString(r.medianTable())
	b.WriteString("\n## Redis time per decision, Redis alone on a CPU\n\n")
	b.WriteString(aloneTable(r.RedisAlone))
	b.WriteString("\n## Redis memory (runs with many keys)\n\n")
	b.WriteString(r.memoryTable())
	b.WriteString("\n## Targets\n\n")
	b.WriteString(r.targetsText())
	b.WriteString("\n![requests per second](chart.svg)\n")
	b.WriteString("\n## Every run\n\n")
	b.WriteString(r.roundsTable())
	for _, p := range r.Profiles {
		fmt.Fprintf(&b, "\n## CPU profile of Caddy, %s (%.0f req/s while profiled)\n\n`go tool pprof -top %s`\n\n```\n%s```\n",
			p.Config, p.RPS, p.Path, p.Top)
	}
	return b.String()
}

// summary is what the command prints at the end.
func (r *report) summary() string {
	var b strings.Builder
	b.WriteString("\n")
	b.WriteString(r.header())
	b.WriteString(r.medianTable())
	b.WriteString("\n")
	b.WriteString(aloneTable(r.RedisAlone))
	b.WriteString("\nRedis memory (runs with many keys):\n\n")
	b.WriteString(r.memoryTable())
	b.WriteString("\nTargets:\n\n")
	b.WriteString(r.targetsText())
	for _, p := range r.Profiles {
		lines := strings.Split(p.Top, "\n")
		if len(lines) > 30 {
			lines = lines[:30]
		}
		fmt.Fprintf(&b, "\nCPU profile of Caddy, %s (%.0f req/s while profiled): %s, top in %s\n\n%s\n",
			p.Config, p.RPS, p.Path, p.TopPath, strings.Join(lines, "\n"))
	}
	return b.String()
}

func (r *report) writeJSON(path string) error {
	type run struct {
		Config   string
		Store    string
		Scenario string
		Conns    int
		Samples  []*sample
	}
	out := struct {
		Machine machine
		Pinning string
		Args    string
		Runs    []run
	}{Machine: r.Machine, Pinning: r.Pinning, Args: r.Args}
	for _, c := range r.Configs {
		out.Runs = append(out.Runs, run{Config: c.Name(), Store: c.Store, Scenario: c.Sc.ID, Conns: c.Sc.Conns, Samples: r.Samples[c.Name()]})
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// chartBar is one bar of the chart: a configuration's median throughput.
type chartBar struct {
	label string
	rps   float64 // median requests per second
	ratio string  // median ratio to the group's plain Caddy, e.g. "1.00x"; "" when unknown
	color string
}

// chartGroup is the bars of one load: its plain Caddy reference first, then
// the stores.
type chartGroup struct {
	label string // the load, without its connections
	sub   string // its connections, e.g. "50 connections"
	bars  []chartBar
}

// chartColors is the color of each store's bars.
var chartColors = map[string]string{"plain": "#9e9e9e", "memory": "#4c78a8", "redis": "#e45756"}

// The chart's layout, in pixels: margins around the plot, the bars and the
// gaps between them, and the plot's height.
const (
	chartLeft, chartRight, chartTop, chartBottom = 70.0, 20.0, 60.0, 85.0
	barW, barGap, groupGap                       = 50.0, 6.0, 50.0
	plotH                                        = 320.0
)

// chart is the scale and size of one drawing.
type chart struct {
	top    float64 // requests per second at the top of the plot
	step   float64 // requests per second between grid lines
	width  float64 // pixels
	height float64 // pixels
}

// svg draws grouped bars: requests per second per configuration, one group
// per load, plain Caddy first in each group as the reference, with the ratio
// to it above every bar.
func (r *report) svg() string {
	groups := r.chartGroups()
	ch := newChart(groups)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", ch.width, ch.height, ch.width, ch.height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="15" font-weight="bold">rate_limit: requests per second</text>`+"\n", chartLeft)
	fmt.Fprintf(&b, `<text x="%.0f" y="38" fill="#333">median of %d rounds; above each bar the median ratio to plain Caddy in the same round</text>`+"\n", chartLeft, r.Rounds)
	ch.writeGrid(&b)
	ch.writeBars(&b, groups)
	ch.writeLegend(&b, groups)
	b.WriteString("</svg>\n")
	return b.String()
}

// chartGroups returns the chart's groups, one per load in the order of the
// configurations.
func (r *report) chartGroups() []chartGroup {
	var groups []chartGroup
	seen := map[string]bool{}
	for _, c := range r.Configs {
		if seen[c.Sc.ID] {
			continue
		}
		seen[c.Sc.ID] = true
		groups = append(groups, r.chartGroup(c.Sc))
	}
	return groups
}

// chartGroup returns the bars of the load sc: its reference plain run and
// each store's.
func (r *report) chartGroup(sc *scenario) chartGroup {
	rpsCol := columns[0]
	conns := fmt.Sprintf("%d connections", sc.Conns)
	if sc.Conns == 1 {
		conns = "1 connection"
	}
	g := chartGroup{label: strings.TrimSuffix(sc.Label, fmt.Sprintf(", %d conn", sc.Conns)), sub: conns}
	if ref, ok := r.find("plain", sc.Ref); ok {
		v, _ := r.med(ref, rpsCol)
		label := "plain"
		if sc.Ref != sc.ID {
			label = "plain (" + ref.Sc.Label + ")"
		}
		g.bars = append(g.bars, chartBar{label: label, rps: v, ratio: "1.00x", color: chartColors["plain"]})
	}
	stores := []string{"memory", "redis"}
	if sc.Baseline {
		stores = []string{"plain"}
	}
	for _, st := range stores {
		if cc, ok := r.find(st, sc.ID); ok {
			v, _ := r.med(cc, rpsCol)
			ratio := ""
			if x, ok := r.med(cc, columns[1]); ok {
				ratio = fmt.Sprintf("%.2fx", x)
			}
			label := st
			if sc.Baseline {
				label = "baseline"
			}
			g.bars = append(g.bars, chartBar{label: label, rps: v, ratio: ratio, color: chartColors[st]})
		}
	}
	return g
}

// newChart scales the chart to the highest bar and sizes it to the bars.
func newChart(groups []chartGroup) *chart {
	maxRPS := 1.0
	for _, g := range groups {
		for _, b := range g.bars {
			maxRPS = max(maxRPS, b.rps)
		}
	}
	ch := &chart{step: niceStep(maxRPS / 5)}
	ch.top = math.Ceil(maxRPS/ch.step) * ch.step
	ch.width = chartLeft + chartRight
	for _, g := range groups {
		ch.width += float64(len(g.bars))*(barW+barGap) + groupGap
	}
	ch.width = max(ch.width, 720)
	ch.height = chartTop + plotH + chartBottom
	return ch
}

// y is the vertical position of v requests per second.
func (ch *chart) y(v float64) float64 { return chartTop + plotH - plotH*v/ch.top }

// writeGrid draws the horizontal grid lines and their labels.
func (ch *chart) writeGrid(b *strings.Builder) {
	for v := 0.0; v <= ch.top+ch.step/2; v += ch.step {
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", chartLeft, ch.width-chartRight, ch.y(v), ch.y(v))
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", chartLeft-6, ch.y(v)+4, kilo(v))
	}
}

// writeBars draws the groups' bars, each with its value and ratio above
// and its label below, and each group's label under its bars.
func (ch *chart) writeBars(b *strings.Builder, groups []chartGroup) {
	x := chartLeft + groupGap/2
	for _, g := range groups {
		gx := x
		for _, bb := range g.bars {
			h := plotH * bb.rps / ch.top
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" fill="%s"><title>%s: %.0f req/s</title></rect>`+"\n", x, ch.y(bb.rps), barW, h, bb.color, bb.label, bb.rps)
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11">%s</text>`+"\n", x+barW/2, ch.y(bb.rps)-16, kilo(bb.rps))
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" font-weight="bold">%s</text>`+"\n", x+barW/2, ch.y(bb.rps)-4, bb.ratio)
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#333">%s</text>`+"\n", x+barW/2, chartTop+plotH+14, shortLabel(bb.label))
			x += barW + barGap
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-weight="bold">%s</text>`+"\n", (gx+x-barGap)/2, chartTop+plotH+32, g.label)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#333">%s</text>`+"\n", (gx+x-barGap)/2, chartTop+plotH+47, g.sub)
		x += groupGap
	}
}

// writeLegend draws the stores' colors, and what plain* stands for when a
// group's reference is another load's plain run.
func (ch *chart) writeLegend(b *strings.Builder, groups []chartGroup) {
	lx := chartLeft
	for _, st := range []string{"plain", "memory", "redis"} {
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n", lx, ch.height-22, chartColors[st], lx+16, ch.height-12, st)
		lx += 90
	}
	for _, g := range groups {
		if len(g.bars) > 0 && strings.HasPrefix(g.bars[0].label, "plain (") {
			fmt.Fprintf(b, `<text x="%.0f" y="%.0f" fill="#333">plain* = %s, the reference of that group</text>`+"\n", lx, ch.height-12, g.bars[0].label)
			break
		}
	}
}

func shortLabel(s string) string {
	if strings.HasPrefix(s, "plain (") {
		return "plain*"
	}
	return s
}

func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func kilo(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}
