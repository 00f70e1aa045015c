package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// floodResult is what a flood of one key saw.
type floodResult struct {
	admitted, denied, other int64
	delayed                 int64 // 200s with X-RateLimit-Delay
	elapsed                 time.Duration
}

// flood sends, from workers connections spread over the nodes, each
// request as soon as the previous one's answer came, to path with key,
// for d; the requests sent before d ends are all counted, whenever they
// are answered.
func flood(t *testing.T, nodes []*localfleet.Node, workers int, d time.Duration, path, key string) floodResult {
	t.Helper()
	var mu sync.Mutex
	var out floodResult
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			tr := &http.Transport{MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			var r floodResult
			for i := 0; time.Now().Before(deadline) && i < 1_000_000; i++ {
				n := nodes[(w+i)%len(nodes)]
				req, _ := http.NewRequest(http.MethodGet, n.URL+path, nil)
				req.Header.Set("X-Key", key)
				resp, err := cl.Do(req)
				if err != nil {
					r.other++
					continue
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					r.admitted++
					if resp.Header.Get("X-Ratelimit-Delay") != "" {
						r.delayed++
					}
				case http.StatusTooManyRequests:
					r.denied++
				default:
					r.other++
				}
			}
			mu.Lock()
			out.admitted, out.denied, out.other, out.delayed = out.admitted+r.admitted, out.denied+r.denied, out.other+r.other, out.delayed+r.delayed
			mu.Unlock()
		})
	}
	wg.Wait()
	out.elapsed = time.Since(start)
	return out
}

// TestSoftShedFleet: three Caddy nodes on one Redis, and a client that
// sends as fast as it can (6 requests at a time, each as soon as the
// previous answer came, spread over the nodes) for 4 s against a zone of
// 150/s with a burst of 50, once without soft shedding and once with
// soft_shed 80: with it the client gets far fewer 429s (6 in flight fit
// in the band of 10 tokens), and the fleet admits the same (within 2%:
// the band's tokens left at the end), never more than the exact bound. The
// delays are counted in the metrics and the stats of the nodes.
func TestSoftShedFleet(t *testing.T) {
	// Not parallel: its client must saturate 150/s with 6 requests in
	// flight, which a machine shared with another fleet test may not.
	r := redistest.Start(t)
	site := fmt.Sprintf(`
	rate_limit {
		%s
		zone plain {
			key {header.X-Key}
			rate 150 1s
			burst 50
			match {
				path /plain
			}
		}
		zone shed {
			key {header.X-Key}
			rate 150 1s
			burst 50
			soft_shed 80
			match {
				path /shed
			}
		}
	}
	respond "ok"`, redisBlock(r))
	nodes := startFleet(t, 3, site)
	const workers, run = 6, 4 * time.Second
	bound := func(f floodResult) int64 { return 50 + int64(150*f.elapsed.Seconds()) + 1 }

	plain := flood(t, nodes, workers, run, "/plain", "client")
	shed := flood(t, nodes, workers, run, "/shed", "client")
	for _, f := range []struct {
		name string
		r    floodResult
	}{{"without soft_shed", plain}, {"with soft_shed 80", shed}} {
		t.Logf("%s: %d admitted (%d delayed), %d denied (429), %d other, in %s; exact bound %d",
			f.name, f.r.admitted, f.r.delayed, f.r.denied, f.r.other, f.r.elapsed.Round(time.Millisecond), bound(f.r))
		if f.r.admitted > bound(f.r) {
			t.Errorf("%s: %d admitted, beyond the exact bound %d", f.name, f.r.admitted, bound(f.r))
		}
		if f.r.other > 0 {
			t.Errorf("%s: %d requests failed or answered neither 200 nor 429", f.name, f.r.other)
		}
	}
	if shed.denied*4 > plain.denied {
		t.Errorf("with soft_shed 80: %d 429s, without: %d; want far fewer", shed.denied, plain.denied)
	}
	if shed.delayed == 0 {
		t.Error("soft_shed delayed no request")
	}
	// The same admitted total, within 2%.
	if diff := plain.admitted - shed.admitted; diff*50 > plain.admitted || -diff*50 > plain.admitted {
		t.Errorf("admitted %d with soft shedding, %d without: want the same within 2%%", shed.admitted, plain.admitted)
	}

	// Every node counted its delays: in the metrics, and in the stats.
	var delayed float64
	var stats int64
	for _, n := range nodes {
		m, err := n.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		delayed += m.Sum("caddy_rate_limit_soft_shed_delayed_total", "zone", "shed")
		if m.Sum("caddy_rate_limit_soft_shed_delay_seconds_count", "zone", "shed") != m.Sum("caddy_rate_limit_soft_shed_delayed_total", "zone", "shed") {
			t.Errorf("node %s: the delay histogram counts otherwise than the delayed total", n.URL)
		}
		if m.Sum("caddy_rate_limit_soft_shed_delayed_total", "zone", "plain") != 0 {
			t.Errorf("node %s counts soft shed delays of a zone without soft_shed", n.URL)
		}
		st := shedStats(t, n)
		stats += st.Delayed
		t.Logf("node %s: soft_shed delayed %d requests, %.3fs in all", n.URL, st.Delayed, st.DelaySeconds)
	}
	if int64(delayed) != shed.delayed || stats != shed.delayed {
		t.Errorf("metrics count %v delayed, the stats %d; the client saw %d", delayed, stats, shed.delayed)
	}
}

// softShedStats is a zone's soft_shed in /rate_limit/stats.
type softShedStats struct {
	Percent      int64   `json:"percent"`
	MaxDelay     string  `json:"max_delay"`
	Delayed      int64   `json:"delayed"`
	DelaySeconds float64 `json:"delay_seconds"`
}

// shedStats reads zone "shed"'s soft_shed from a node's stats.
func shedStats(t *testing.T, n *localfleet.Node) softShedStats {
	t.Helper()
	resp, err := http.Get("http://" + n.Admin + "/rate_limit/stats?series=0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Zones []struct {
			Name     string         `json:"name"`
			SoftShed *softShedStats `json:"soft_shed"`
		} `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, z := range doc.Zones {
		if z.Name == "shed" {
			if z.SoftShed == nil || z.SoftShed.Percent != 80 || z.SoftShed.MaxDelay != "1s" {
				t.Fatalf("zone shed's soft_shed in the stats: %+v, want 80%% and 1s", z.SoftShed)
			}
			return *z.SoftShed
		}
		if z.Name == "plain" && z.SoftShed != nil {
			t.Errorf("zone plain has soft_shed stats: %+v", z.SoftShed)
		}
	}
	t.Fatalf("no zone shed in the stats of %s", n.URL)
	return softShedStats{}
}

// TestSoftShedClientLeaves: a client that leaves while soft_shed delays
// its request is released at once (499 in the log, nothing passed on), and
// keeps its charge, as a leaky bucket's does: the next request finds the
// token spent. A dry-run soft_shed zone delays nothing.
func TestSoftShedClientLeaves(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone api {
			key {header.X-Key}
			rate 2 1h
			soft_shed 50 10s
			match {
				path /
			}
		}
		zone trial {
			key {header.X-Key}
			rate 2 1h
			soft_shed 50 10s
			dry_run
			match {
				path /trial
			}
		}
	}
	respond "ok"`)
	// The first token passes at once; the second waits 10s (the refill
	// of a token past the threshold takes half an hour, capped at 10s):
	// the client gives up after 300ms.
	if r := n.get("/", "X-Key: k"); r.Status != 200 || r.Header.Get("X-Ratelimit-Delay") != "" {
		t.Fatalf("first request: %d, delay %q", r.Status, r.Header.Get("X-Ratelimit-Delay"))
	}
	cl := &http.Client{Timeout: 300 * time.Millisecond}
	req, _ := http.NewRequest(http.MethodGet, n.URL+"/", nil)
	req.Header.Set("X-Key", "k")
	start := time.Now()
	if resp, err := cl.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the delayed request was answered %d within %s", resp.StatusCode, time.Since(start))
	}
	// The charge stays: the bucket is empty.
	r := n.get("/", "X-Key: k")
	if r.Status != 429 {
		t.Fatalf("after the client left: %d, want 429 (the delayed request kept its charge)", r.Status)
	}
	if ra, _ := strconv.Atoi(r.Header.Get("Retry-After")); ra < 1000 {
		t.Errorf("Retry-After %q, want about half an hour", r.Header.Get("Retry-After"))
	}
	// A dry run's delay is counted, not waited for.
	for i := range 2 {
		start := time.Now()
		r := n.get("/trial", "X-Key: dry")
		if r.Status != 200 || time.Since(start) > 5*time.Second || r.Header.Get("X-Ratelimit-Delay") != "" {
			t.Fatalf("dry run, request %d: %d after %s, delay %q; want 200 at once", i+1, r.Status, time.Since(start), r.Header.Get("X-Ratelimit-Delay"))
		}
	}
}
