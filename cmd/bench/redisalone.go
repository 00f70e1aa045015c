package main

// Redis' time per decision with Redis on a CPU of its own. In the rounds
// Redis shares its CPU with wrk (of the machine's two CPUs one is Caddy's),
// so the time it spends per decision counts what that sharing costs it:
// waiting for the CPU in the middle of a script, and the cache misses of
// running beside the load generator. A Redis server in production has its
// core to itself, and sizing a fleet's shards (docs/sizing.md) asks what
// that core spends per decision. This pass runs the Redis configurations
// once more with Caddy and wrk together on Caddy's CPU and Redis alone on
// the other. Only Redis' figures of the pass are reported: Caddy's, sharing
// its CPU with wrk, are not comparable with the rounds'.

import (
	"fmt"
	"os"
	"strings"
)

// aloneResult is the pass's figure for one configuration: Redis' time per
// decision (EVALSHA usec over the decisions sent) in each run, and the
// decisions an EVALSHA carried.
type aloneResult struct {
	Config    string
	USPerDec  []float64
	DecPerCal []float64
}

// redisAlone runs each admitted Redis configuration (hot key, many keys)
// runs times with Redis alone on its CPU. Without pinning it returns nil:
// there is no CPU to give Redis alone.
func (b *bench) redisAlone(runs int) []aloneResult {
	if !b.pin.on() || runs <= 0 {
		return nil
	}
	saved := b.pin
	defer func() { b.pin = saved }()
	// Caddy and wrk on Caddy's CPU; Redis stays on the load CPU, where
	// start pinned it.
	b.pin.loadCPU = b.pin.caddyCPU
	var out []aloneResult
	for _, c := range b.configs {
		if c.Store != "redis" || (c.Sc.ID != "hot" && c.Sc.ID != "keys") {
			continue
		}
		res := aloneResult{Config: c.Name()}
		for range runs {
			b.waitQuiet()
			fmt.Fprintf(os.Stderr, "redis alone on CPU %s: ", saved.loadCPU)
			s := b.runOne(c, 0)
			if r := s.Redis; r != nil && r.Decisions > 0 && r.Calls > 0 {
				res.USPerDec = append(res.USPerDec, float64(r.Usec)/float64(r.Decisions))
				res.DecPerCal = append(res.DecPerCal, float64(r.Decisions)/float64(r.Calls))
			}
		}
		out = append(out, res)
	}
	return out
}

// aloneTable is the markdown of the pass's results.
func aloneTable(rs []aloneResult) string {
	if len(rs) == 0 {
		return "Not run (it needs two CPUs and pinning).\n"
	}
	var b strings.Builder
	b.WriteString("Redis alone on a CPU, Caddy and wrk together on the other (Redis' figures only):\n\n")
	b.WriteString("| configuration | Redis us/decision (median) | runs | decisions/evalsha (median) |\n|---|---:|---|---:|\n")
	for _, r := range rs {
		runs := make([]string, len(r.USPerDec))
		for i, x := range r.USPerDec {
			runs[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %s | %.1f |\n", r.Config, median(r.USPerDec), strings.Join(runs, ", "), median(r.DecPerCal))
	}
	return b.String()
}
