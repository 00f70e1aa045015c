package tests

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// classCount is what happened to one priority class's requests.
type classCount struct {
	sent, admitted, denied, failedOpen, errors int
	errorKinds                                 map[string]int
	// perSecond counts admitted and denied requests per second of the
	// run (by when the answer came back).
	perSecond map[int][2]int
}

func newClassCount() *classCount {
	return &classCount{errorKinds: map[string]int{}, perSecond: map[int][2]int{}}
}

// add counts one answer, which came back at elapsed into the run.
func (c *classCount) add(status int, limited bool, err error, elapsed time.Duration) {
	c.sent++
	sec := int(elapsed / time.Second)
	ps := c.perSecond[sec]
	switch {
	case err != nil:
		c.errors++
		c.errorKinds[err.Error()]++
	case status == http.StatusOK && !limited:
		c.failedOpen++
	case status == http.StatusOK:
		c.admitted++
		ps[0]++
	case status == http.StatusTooManyRequests:
		c.denied++
		ps[1]++
	default:
		c.errors++
		c.errorKinds[fmt.Sprintf("status %d", status)]++
	}
	c.perSecond[sec] = ps
}

// getLimited sends a GET and reports its status and whether the response
// carries the rate limit fields (a 200 without them passed because the
// store failed).
func getLimited(ctx context.Context, cl *http.Client, url string, headers ...string) (int, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false, err
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Ratelimit") != "", err
}

// TestPriority saturates one global zone (key global, 100 per second,
// burst 100) from three Caddy nodes sharing Redis with two classes of
// requests, their reserve from a map of the path: /critical may take the
// last token (reserve 0) and sends 40 requests per second, below the
// rate; /bulk must leave 30% of the capacity (reserve 30) and floods.
// While bulk is shed, critical gets every token it asks for, and the two
// together stay within the exact bound burst + rate x elapsed.
func TestPriority(t *testing.T) {
	t.Parallel()
	const (
		rate, burst  = 100, 100
		criticalRate = 40 // per second, well below the zone's rate
		duration     = 6 * time.Second
		bulkConns    = 30
	)
	r := redistest.Start(t)
	nodes := startFleet(t, 3, fmt.Sprintf(`
	map {path} {prio_reserve} {
		/critical 0
		default 30
	}
	rate_limit {
		%s
		zone global {
			key global
			rate %d 1s
			burst %d
			reserve {prio_reserve}
		}
	}
	respond "ok"`, redisBlock(r), rate, burst))

	critical, bulk, elapsed := runPriorityLoad(nodes, criticalRate, bulkConns, duration)

	total := critical.admitted + bulk.admitted
	bound := burst + rate*elapsed.Seconds()
	t.Logf("one global zone (%d/s, burst %d), 3 nodes, %s: admitted per class: critical (reserve 0) %d of %d (denied %d), bulk (reserve 30) %d of %d (denied %d); total %d, bound burst + rate x elapsed %.2f (ratio %.4f)",
		rate, burst, elapsed.Round(time.Millisecond), critical.admitted, critical.sent, critical.denied,
		bulk.admitted, bulk.sent, bulk.denied, total, bound, float64(total)/bound)
	var perSec strings.Builder
	for s := 0; s <= int(elapsed/time.Second); s++ {
		fmt.Fprintf(&perSec, "\n  second %d: critical admitted %d denied %d; bulk admitted %d denied %d",
			s, critical.perSecond[s][0], critical.perSecond[s][1], bulk.perSecond[s][0], bulk.perSecond[s][1])
	}
	t.Logf("per second:%s", perSec.String())

	for name, c := range map[string]*classCount{"critical": critical, "bulk": bulk} {
		if c.errors > 0 {
			t.Errorf("%s: %d errors: %v", name, c.errors, c.errorKinds)
		}
		if c.failedOpen > 0 {
			t.Errorf("%s: %d requests passed because the store failed: the bound cannot be checked", name, c.failedOpen)
		}
	}
	// The reserve-0 class asks for less than the rate: it always gets
	// its tokens, from the 30% the other class must leave.
	if critical.denied > 0 {
		t.Errorf("critical (reserve 0, %d/s below the rate %d/s): %d of %d denied while bulk was shed", criticalRate, rate, critical.denied, critical.sent)
	}
	if min := int(duration.Seconds()*criticalRate) / 2; critical.sent < min {
		t.Errorf("critical sent only %d requests (want at least %d): the load did not run", critical.sent, min)
	}
	// The reserve-30 class was shed: it asked for far more than was left.
	if bulk.denied < bulk.admitted {
		t.Errorf("bulk (reserve 30): %d denied, %d admitted: the flood did not saturate the zone", bulk.denied, bulk.admitted)
	}
	// Exact: never above burst + rate x elapsed (the elapsed time holds
	// every decision) ...
	if float64(total) > math.Floor(bound+1e-9) {
		t.Errorf("admitted %d in all, above the bound %.2f", total, bound)
	}
	// ... and the zone was used: bulk takes what critical leaves, all but
	// the reserve, so together they get about rate x elapsed.
	if float64(total) < 0.9*rate*elapsed.Seconds() {
		t.Errorf("admitted only %d in all in %s: the zone (%d/s) was not saturated", total, elapsed, rate)
	}
}

// runPriorityLoad floods /bulk from bulkConns connections spread over
// nodes and sends criticalRate requests per second to /critical, for
// duration; it returns what happened to each class and how long it took
// until the last answer.
func runPriorityLoad(nodes []*localfleet.Node, criticalRate, bulkConns int, duration time.Duration) (critical, bulk *classCount, elapsed time.Duration) {
	critical, bulk = newClassCount(), newClassCount()
	var mu sync.Mutex // guards critical and bulk
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now() // before the first request

	// Bulk: connections spread over the nodes, each sending as fast as
	// answers come back.
	for c := range bulkConns {
		wg.Go(func() {
			tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			url := nodes[c%len(nodes)].URL + "/bulk"
			for ctx.Err() == nil {
				status, limited, err := getLimited(context.Background(), cl, url)
				mu.Lock()
				bulk.add(status, limited, err, time.Since(start))
				mu.Unlock()
			}
		})
	}

	// Critical: one request every 25 ms, round robin over the nodes,
	// each on its own goroutine so that a slow answer does not hold
	// back the next one.
	crTransport := &http.Transport{MaxIdleConnsPerHost: 32}
	defer crTransport.CloseIdleConnections()
	crClient := &http.Client{Transport: crTransport, Timeout: 10 * time.Second}
	tick := time.NewTicker(time.Second / time.Duration(criticalRate))
	for i := 0; ctx.Err() == nil; i++ {
		url := nodes[i%len(nodes)].URL + "/critical"
		wg.Go(func() {
			status, limited, err := getLimited(context.Background(), crClient, url)
			mu.Lock()
			critical.add(status, limited, err, time.Since(start))
			mu.Unlock()
		})
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	tick.Stop()
	wg.Wait()
	elapsed = time.Since(start) // after the last answer
	return critical, bulk, elapsed
}
