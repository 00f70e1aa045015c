package tests

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// tier is one plan of the tiers test: its API key and the rate (per
// minute) and burst its map entry gives.
type tier struct {
	key         string
	rate, burst int
}

// The tiers: a token every 10 s, 20 s and 60 s, so that a burst sent at
// once is over long before one token comes back.
var tiers = []tier{
	{key: "key-gold", rate: 6, burst: 24},
	{key: "key-silver", rate: 3, burst: 12},
	{key: "key-bronze", rate: 1, burst: 4},
}

// tiersSite maps the API key to its plan's rate and burst; key-broken's
// rate is not a number and key-zero's burst is 0, neither a valid limit.
func tiersSite(redis string) string {
	var entries string
	for _, tr := range tiers {
		entries += fmt.Sprintf("\t\t%s %d %d\n", tr.key, tr.rate, tr.burst)
	}
	return fmt.Sprintf(`
	map {header.X-API-Key} {plan_rate} {plan_burst} {
%s		key-broken lots 10
		key-zero 5 0
		default 2 2
	}
	rate_limit {
		%s
		zone api {
			key {header.X-API-Key} {client_ip}
			rate {plan_rate} 1m
			burst {plan_burst}
		}
	}
	respond "ok"`, entries, redis)
}

// TestTiers sends each of three API keys of three plans (a map of the key
// to its rate and burst) its burst and more at once, through real Caddy,
// then a few more one by one: each key is admitted exactly its own plan's
// burst, every response, admitted or denied, reports that plan's rate in
// X-RateLimit-Limit and RateLimit-Policy, and every denial's Retry-After
// is within that plan's token interval. A key whose plan gives an invalid value is answered
// 500. With Redis, the requests alternate over two nodes: the plan's
// burst holds across them.
func TestTiers(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		n := localfleet.StartNode(t, caddyBin, "", tiersSite(""))
		checkTiers(t, []*localfleet.Node{n})
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		r := redistest.Start(t)
		checkTiers(t, startFleet(t, 2, tiersSite(redisBlock(r))))
	})
}

// checkTiers runs the tiers test against nodes, the requests of each key
// alternating over them.
func checkTiers(t *testing.T, nodes []*localfleet.Node) {
	t.Helper()
	got := make([]tierOutcome, len(tiers))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, tr := range tiers {
		wg.Go(func() {
			o := sendTierBurst(t, nodes, tr)
			mu.Lock()
			got[i] = o
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, tr := range tiers {
		o := got[i]
		interval := time.Minute / time.Duration(tr.rate)
		t.Logf("%s (rate %d/min, burst %d): %d admitted, %d denied, in %s over %d node(s)",
			tr.key, tr.rate, tr.burst, o.admitted, o.denied, o.elapsed.Round(time.Millisecond), len(nodes))
		if o.elapsed >= interval {
			// Not the limiter's fault: a token came back before the
			// requests were all answered, so the count is not the burst.
			t.Errorf("%s: the requests took %s, not within one token's interval (%s): the machine was too slow to tell", tr.key, o.elapsed, interval)
			continue
		}
		if o.admitted != tr.burst {
			t.Errorf("%s: %d admitted, want its plan's burst %d", tr.key, o.admitted, tr.burst)
		}
	}
	checkInvalidPlans(t, nodes)
}

// tierOutcome is what a tier's key was answered, and how long it took.
type tierOutcome struct {
	admitted, denied int
	elapsed          time.Duration
}

// sendTierBurst sends tr's key its burst and 10 more at once, then two
// more through each node one by one (denials that a node's deny cache may
// answer on its own): every answer reports the plan's rate, and every
// denial's Retry-After is within the plan's interval.
func sendTierBurst(t *testing.T, nodes []*localfleet.Node, tr tier) tierOutcome {
	const extra = 10 // requests beyond the burst, each to be denied
	// Every request of the key at once, so that the whole burst is asked
	// for well within one token's interval.
	count := tr.burst + extra
	resps := make([]localfleet.Response, count, count+2*len(nodes))
	errs := make([]error, count, count+2*len(nodes))
	var rw sync.WaitGroup
	start := time.Now()
	for j := range count {
		rw.Go(func() {
			resps[j], errs[j] = nodes[j%len(nodes)].Do(http.MethodGet, "/", "X-API-Key: "+tr.key)
		})
	}
	rw.Wait()
	for j := range 2 * len(nodes) {
		r, err := nodes[j%len(nodes)].Do(http.MethodGet, "/", "X-API-Key: "+tr.key)
		resps, errs = append(resps, r), append(errs, err)
	}
	o := tierOutcome{elapsed: time.Since(start)}
	policy := fmt.Sprintf(`"api";q=%d;w=60`, tr.rate)
	interval := 60 / tr.rate // seconds per token
	for j, r := range resps {
		if errs[j] != nil {
			t.Errorf("%s request %d: %v", tr.key, j, errs[j])
			continue
		}
		switch r.Status {
		case http.StatusOK:
			o.admitted++
		case http.StatusTooManyRequests:
			o.denied++
			// The next token of this plan is at most one
			// interval away.
			if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 || ra > interval {
				t.Errorf("%s request %d: Retry-After %q, want 1 to %d (the plan's interval)", tr.key, j, r.Header.Get("Retry-After"), interval)
			}
		default:
			t.Errorf("%s request %d: status %d, body %q", tr.key, j, r.Status, r.Body)
			continue
		}
		if v := r.Header.Get("X-Ratelimit-Limit"); v != strconv.Itoa(tr.rate) {
			t.Errorf("%s request %d (status %d): X-RateLimit-Limit %q, want its plan's rate %d", tr.key, j, r.Status, v, tr.rate)
		}
		if v := r.Header.Get("Ratelimit-Policy"); v != policy {
			t.Errorf("%s request %d (status %d): RateLimit-Policy %q, want %q", tr.key, j, r.Status, v, policy)
		}
	}
	return o
}

// checkInvalidPlans: a plan whose values never make a rule is a server
// error (not a denial, not a pass) on every node, and a valid tier is
// unaffected.
func checkInvalidPlans(t *testing.T, nodes []*localfleet.Node) {
	t.Helper()
	for _, key := range []string{"key-broken", "key-zero"} {
		for i, n := range nodes {
			r, err := n.Do(http.MethodGet, "/", "X-API-Key: "+key)
			if err != nil {
				t.Fatalf("%s via node %d: %v", key, i+1, err)
			}
			if r.Status != http.StatusInternalServerError {
				t.Errorf("%s via node %d: status %d (body %q), want 500 for an invalid plan value", key, i+1, r.Status, r.Body)
			}
			if r.Body == "ok" {
				t.Errorf("%s via node %d: the request passed to the handler after the rate limit", key, i+1)
			}
		}
	}
	// A valid tier is unaffected by the invalid ones: the default plan
	// (2 per minute, burst 2) still admits its burst.
	n := nodes[0]
	for i := 1; i <= 3; i++ {
		r, err := n.Do(http.MethodGet, "/", "X-API-Key: key-unlisted")
		if err != nil {
			t.Fatal(err)
		}
		want := http.StatusOK
		if i == 3 {
			want = http.StatusTooManyRequests
		}
		if r.Status != want || r.Header.Get("X-Ratelimit-Limit") != "2" {
			t.Errorf("default plan, request %d: status %d X-RateLimit-Limit %q, want %d and 2", i, r.Status, r.Header.Get("X-Ratelimit-Limit"), want)
		}
	}
}
