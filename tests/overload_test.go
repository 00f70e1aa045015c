package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// startCPUStress keeps workers CPUs busy with stress-ng for at most d, as
// a child process of the test that is stopped when the test ends. Like
// redis-server, stress-ng is required in CI (CI set): there a missing
// binary fails the test; elsewhere the test is skipped with a note.
func startCPUStress(t *testing.T, workers int, d time.Duration) (running func() bool) {
	t.Helper()
	if _, err := exec.LookPath("stress-ng"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("stress-ng is required by this test and is not on PATH (install it: apt-get install stress-ng): %v", err)
		}
		t.Skipf("stress-ng is not on PATH (apt-get install stress-ng); CI is not set, so this test is skipped: %v", err)
	}
	cmd := exec.Command("stress-ng", "--cpu", fmt.Sprint(workers), "--timeout", fmt.Sprintf("%ds", int(d.Seconds())), "--quiet")
	log := &localfleet.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting stress-ng: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		// SIGTERM lets stress-ng stop its workers; SIGKILL if it lingers.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if out := strings.TrimSpace(log.String()); out != "" {
			t.Logf("stress-ng output:\n%s", out)
		}
	})
	// It runs: give its workers a moment to start, and check it did not
	// exit at once (bad arguments).
	time.Sleep(300 * time.Millisecond)
	select {
	case <-done:
		t.Fatalf("stress-ng exited at once: %s", log.String())
	default:
	}
	return func() bool {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
}

// TestFleetExactnessUnderCPUStress is the fleet exactness scenario (three
// nodes, one Redis, 60 connections, 10 s) while stress-ng keeps both CPUs
// busy, with the default timeout and failure policy: a node starved of
// CPU must not turn slow Redis answers into admissions beyond the bound
// (admitted, failed-open requests included, within 1% of the exact
// bound), and the circuit breaker must stay closed while Redis answers.
// It loads the machine, so it does not run in parallel with the
// package's other tests.
func TestFleetExactnessUnderCPUStress(t *testing.T) {
	r := redistest.Start(t)
	// The default timeout and failure policy: only the address.
	sc := localfleet.Exactness(fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t}", r.Addr))
	nodes := startFleet(t, 3, sc.Site)
	before := scrapeAll(t, nodes)

	const d = 10 * time.Second
	stressRunning := startCPUStress(t, 2, d+20*time.Second)

	bs := &breakerSampler{nodes: nodes, seen: make([]float64, len(nodes))}
	rep := localfleet.Run(context.Background(), localfleet.Load{
		Nodes: nodes, Targets: sc.Targets, Connections: 60, Duration: d, During: bs.during,
	})
	stressed := stressRunning()
	after := scrapeAll(t, nodes)
	if pong := r.MustDo("PING"); pong != "PONG" {
		t.Fatalf("redis does not answer after the run: %q", pong)
	}

	t.Logf("3 nodes, 60 connections, %s under stress-ng --cpu 2 (still running at the end: %v):\n%s\n%s",
		rep.Duration.Round(time.Millisecond), stressed, rep.Table(), rep.DeniedTable(sc.Targets))
	if !stressed {
		t.Errorf("stress-ng ended before the load did: the run was not under stress")
	}

	checkAdmittedWithinBound(t, rep)
	reasons := logFallbacks(t, before, after, bs)
	// Redis answered throughout: the breaker must not have opened. The
	// gauge is sampled (it could open and close between samples), so
	// decisions refused by an open breaker are the complete record.
	if n := reasons["breaker_open"]; n > 0 {
		t.Errorf("%.0f decisions were refused by an open circuit breaker while Redis answered", n)
	}
	for i, v := range bs.seen {
		if v > 0 || after[i].Sum("caddy_rate_limit_breaker_open") > 0 {
			t.Errorf("node %d: the circuit breaker opened while Redis answered", i+1)
		}
	}
}

// breakerSampler reads each node's breaker gauge every 500 ms of a load,
// and keeps the most it read per node.
type breakerSampler struct {
	nodes   []*localfleet.Node
	mu      sync.Mutex
	seen    []float64 // the most the gauge read, per node
	samples int
	last    time.Duration
}

// during is the load's During hook.
func (bs *breakerSampler) during(elapsed time.Duration) {
	if elapsed-bs.last < 500*time.Millisecond {
		return
	}
	bs.last = elapsed
	for i, n := range bs.nodes {
		m, err := n.Metrics()
		if err != nil {
			continue // a starved node's admin endpoint may be slow; the end scrape is what counts
		}
		bs.mu.Lock()
		bs.seen[i] = max(bs.seen[i], m.Sum("caddy_rate_limit_breaker_open"))
		bs.mu.Unlock()
	}
	bs.samples++
}

// checkAdmittedWithinBound: every bucket admitted, failed-open requests
// included, within 1% of its exact bound, and no target had errors.
func checkAdmittedWithinBound(t *testing.T, rep *localfleet.Report) {
	t.Helper()
	// Admitted per bucket: the requests admitted with rate limit fields,
	// and those that passed because the store failed (the default policy
	// lets them through, so they count against the bound like any other).
	failedOpen := map[*localfleet.Bucket]int64{}
	for tg, s := range rep.Targets {
		for _, b := range tg.Buckets {
			failedOpen[b] += s.FailedOpen * tg.Cost
		}
		if s.Errors > 0 {
			t.Errorf("target %s: %d errors: %v", tg.Name, s.Errors, s.ErrorKinds)
		}
	}
	worst := 0.0
	for _, bs := range rep.Buckets {
		b := bs.Bucket
		admitted := bs.Tokens + failedOpen[b]
		ratio := float64(admitted) / bs.Bound
		worst = max(worst, ratio)
		t.Logf("%s/%s: admitted %d (%d with a decision, %d failed open) / bound %.2f = %.4f",
			b.Zone, b.Key, admitted, bs.Tokens, failedOpen[b], bs.Bound, ratio)
		if float64(admitted) > 1.01*bs.Bound {
			t.Errorf("%s/%s admitted %d tokens (%d of them failed open), above 1.01 x the bound %.2f (ratio %.4f)",
				b.Zone, b.Key, admitted, failedOpen[b], bs.Bound, ratio)
		}
	}
	t.Logf("worst admitted/bound ratio: %.4f", worst)

}

// logFallbacks logs the fallbacks the nodes took, from their metrics, and
// returns the store errors by reason, all nodes together.
func logFallbacks(t *testing.T, before, after []localfleet.Metrics, bs *breakerSampler) map[string]float64 {
	t.Helper()
	nodes := bs.nodes
	// The fallbacks the nodes took, from their metrics: decisions by
	// outcome other than allowed/denied, and store errors by reason.
	const decisions, storeErrors = "caddy_rate_limit_decisions_total", "caddy_rate_limit_store_errors_total"
	outcomes := delta(before, after, "outcome", decisions)
	reasons := delta(before, after, "reason", storeErrors)
	t.Logf("decisions by outcome (all nodes and zones): %s", formatCounts(outcomes))
	t.Logf("store errors by reason (all nodes): %s", formatCounts(reasons))
	for i := range nodes {
		o := delta(before[i:i+1], after[i:i+1], "outcome", decisions)
		e := delta(before[i:i+1], after[i:i+1], "reason", storeErrors)
		t.Logf("node %d: failed_open %.0f, local_allowed %.0f, local_denied %.0f, failed_closed %.0f; store errors %s; breaker gauge at most %.0f in %d samples, %.0f at the end",
			i+1, o["failed_open"], o["local_allowed"], o["local_denied"], o["failed_closed"], formatCounts(e),
			bs.seen[i], bs.samples, after[i].Sum("caddy_rate_limit_breaker_open"))
	}

	return reasons
}

// scrapeAll reads every node's metrics.
func scrapeAll(t *testing.T, nodes []*localfleet.Node) []localfleet.Metrics {
	t.Helper()
	out := make([]localfleet.Metrics, len(nodes))
	for i, n := range nodes {
		m, err := n.Metrics()
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
		out[i] = m
	}
	return out
}

// delta is, per value of the label by, how much the counter name grew
// from before to after, summed over the nodes.
func delta(before, after []localfleet.Metrics, by, name string) map[string]float64 {
	out := map[string]float64{}
	for i := range after {
		for k, v := range after[i].By(by, name) {
			out[k] += v
		}
		for k, v := range before[i].By(by, name) {
			out[k] -= v
		}
	}
	return out
}

func formatCounts(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}
