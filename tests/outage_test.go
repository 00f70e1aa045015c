package tests

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The bound across an outage: 3 nodes, 20 keys at 50 per second with a
// burst of 50, 40 connections, each request to the next node in turn, and
// Redis goes away mid-run. Per key, the fleet admits at most
// burst + rate x elapsed over the whole run (with a 2% allowance), over the
// outage alone, and over the time after Redis returned (1%).

const (
	outageKeys  = 20
	outageRate  = 50
	outageConns = 40
)

// outageSite is the fleet's site: the default on_error (local), no
// fleet_size, so that the divisor comes from the fleet view.
func outageSite(redis string) string {
	return fmt.Sprintf(`
	rate_limit {
		redis {
			%s
		}
		zone api {
			key {header.X-Key}
			rate %d 1s
			burst %d
		}
	}
	respond "ok"`, redis, outageRate, outageRate)
}

// admission is one admitted request: when it was sent and answered.
type admission struct {
	sent, answered time.Time
}

// outageRun is what a run admitted per key.
type outageRun struct {
	mu    sync.Mutex
	keys  [outageKeys][]admission
	other map[string]int // answers other than 200 and 429
	start time.Time
	end   time.Time
}

// runOutageLoad sends the load for d, calling fault (in its own goroutine)
// once the load runs.
func runOutageLoad(t *testing.T, nodes []*localfleet.Node, d time.Duration, fault func()) *outageRun {
	t.Helper()
	run := &outageRun{other: map[string]int{}}
	tr := &http.Transport{MaxIdleConnsPerHost: outageConns, MaxConnsPerHost: outageConns}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	run.start = time.Now()
	deadline := run.start.Add(d)
	var wg sync.WaitGroup
	for c := range outageConns {
		wg.Go(func() {
			key := c % outageKeys
			for i := c; time.Now().Before(deadline); i++ {
				n := nodes[i%len(nodes)]
				req, _ := http.NewRequest("GET", n.URL+"/", nil)
				req.Header.Set("X-Key", fmt.Sprintf("key-%d", key))
				sent := time.Now()
				resp, err := cl.Do(req)
				answered := time.Now()
				if err != nil {
					run.mu.Lock()
					run.other[strings.SplitN(err.Error(), ":", 2)[0]]++
					run.mu.Unlock()
					continue
				}
				resp.Body.Close()
				run.mu.Lock()
				switch resp.StatusCode {
				case 200:
					run.keys[key] = append(run.keys[key], admission{sent, answered})
				case 429:
				default:
					run.other[resp.Status]++
				}
				run.mu.Unlock()
			}
		})
	}
	wg.Go(fault)
	wg.Wait()
	run.end = time.Now()
	return run
}

// ratio returns the worst and median key's admissions in [from, to]
// (requests sent at or after from and answered by to) over the bound
// burst + rate x (to - from).
func (r *outageRun) ratio(from, to time.Time) (worst, median float64) {
	bound := float64(outageRate) + outageRate*to.Sub(from).Seconds()
	ratios := make([]float64, 0, outageKeys)
	for _, list := range r.keys {
		n := 0
		for _, a := range list {
			if !a.sent.Before(from) && !a.answered.After(to) {
				n++
			}
		}
		ratios = append(ratios, float64(n)/bound)
	}
	for i := range ratios { // sort: 20 values
		for j := i + 1; j < len(ratios); j++ {
			if ratios[j] < ratios[i] {
				ratios[i], ratios[j] = ratios[j], ratios[i]
			}
		}
	}
	return ratios[len(ratios)-1], ratios[len(ratios)/2]
}

// outageDuration is the run's length: 20 s as in the issue, or shorter
// with FLEETLIMIT_OUTAGE_SECONDS on a slow machine (the same structure:
// the fault at 30%, Redis back at 70%).
func outageDuration() time.Duration {
	if s := os.Getenv("FLEETLIMIT_OUTAGE_SECONDS"); s != "" {
		if d, err := time.ParseDuration(s + "s"); err == nil && d > 0 {
			return d
		}
	}
	return 20 * time.Second
}

// checkOutage logs and checks the ratios of a run whose outage lasted from
// down to up.
func checkOutage(t *testing.T, run *outageRun, down, up time.Time) {
	t.Helper()
	whole, wholeMed := run.ratio(run.start, run.end)
	out, outMed := run.ratio(down, up)
	after, afterMed := run.ratio(up, run.end)
	t.Logf("worst / median key over the bound: whole run %.3f / %.3f; outage (%s) %.3f / %.3f; after return (%s) %.3f / %.3f; other answers %v",
		whole, wholeMed, up.Sub(down).Round(time.Millisecond), out, outMed,
		run.end.Sub(up).Round(time.Millisecond), after, afterMed, run.other)
	if whole > 1.02 {
		t.Errorf("whole run: worst key at %.3f of the bound, want at most 1.02", whole)
	}
	if out > 1.0 {
		t.Errorf("outage: worst key at %.3f of the bound, want at most 1.0", out)
	}
	if after > 1.01 {
		t.Errorf("after return: worst key at %.3f of the bound, want at most 1.01", after)
	}
	// The load saturates every key: a fleet that denied everything
	// would pass the checks above.
	if wholeMed < 0.5 {
		t.Errorf("whole run: the median key got %.3f of the bound: the fleet over-denied", wholeMed)
	}
}

// warmFleet sends each node a request, and waits until every node's fleet
// view counts the 3 nodes (their local buckets divide by it), so that the
// load starts on a fleet that knows itself.
func warmFleet(t *testing.T, nodes []*localfleet.Node) {
	t.Helper()
	for _, n := range nodes {
		_, _ = n.Do("GET", "/", "X-Key: warm")
	}
	waitFleetView(t, nodes, len(nodes))
}

// TestOutagePause: Redis stopped (SIGSTOP) for 40% of the run.
func TestOutagePause(t *testing.T) {
	r := redistest.Start(t)
	nodes := startFleet(t, 3, outageSite("address "+r.Addr))
	warmFleet(t, nodes)
	d := outageDuration()
	var down, up time.Time
	run := runOutageLoad(t, nodes, d, func() {
		time.Sleep(d * 3 / 10)
		down = time.Now()
		r.Pause()
		time.Sleep(d * 4 / 10)
		r.Resume()
		up = time.Now()
	})
	checkOutage(t, run, down, up)
}

// TestOutageEmptyRestart: Redis killed (SIGKILL), and restarted empty 25%
// of the run later.
func TestOutageEmptyRestart(t *testing.T) {
	r := redistest.Start(t)
	nodes := startFleet(t, 3, outageSite("address "+r.Addr))
	warmFleet(t, nodes)
	d := outageDuration()
	var down, up time.Time
	run := runOutageLoad(t, nodes, d, func() {
		time.Sleep(d * 3 / 10)
		down = time.Now()
		r.Stop()
		time.Sleep(d / 4)
		r.Restart()
		up = time.Now()
	})
	checkOutage(t, run, down, up)
}

// TestOutageFailover: the master behind Sentinel killed (SIGKILL); the
// outage lasts until the sentinels promoted the replica.
func TestOutageFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	nodes := startFleet(t, 3, outageSite(fmt.Sprintf("sentinel %s %s", st.MasterName(), strings.Join(st.SentinelAddrs(), " "))))
	warmFleet(t, nodes)
	d := outageDuration()
	var down, up time.Time
	run := runOutageLoad(t, nodes, d, func() {
		time.Sleep(d * 3 / 10)
		down = time.Now()
		old := st.KillMaster()
		st.WaitFailover(old, d/2)
		up = time.Now()
	})
	checkOutage(t, run, down, up)
}
