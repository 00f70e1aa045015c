package tests

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// quotaSite is a plan of a rate and a monthly quota in Berlin, and a daily
// quota in New York counted in each request's cost.
func quotaSite(redis string) string {
	return fmt.Sprintf(`
	rate_limit {
		%s
		zone plan {
			key {header.X-Key}
			rate 1000 1s
			quota 50 per month tz Europe/Berlin
		}
		zone daily {
			key {header.X-Key}
			quota 30 per day tz America/New_York
			cost {header.X-Cost}
			match {
				header X-Cost *
			}
		}
	}
	respond "ok"`, redis)
}

// quotaRun is what a burst of requests of one key got from the fleet.
type quotaRun struct {
	admitted, denied []int // per node
	resps            []localfleet.Response
}

// sendQuota sends count requests with headers at once, spread over nodes.
func sendQuota(t *testing.T, nodes []*localfleet.Node, count int, headers ...string) quotaRun {
	t.Helper()
	run := quotaRun{admitted: make([]int, len(nodes)), denied: make([]int, len(nodes)), resps: make([]localfleet.Response, count)}
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() { run.resps[i], errs[i] = nodes[i%len(nodes)].Do(http.MethodGet, "/", headers...) })
	}
	wg.Wait()
	for i, r := range run.resps {
		switch {
		case errs[i] != nil:
			t.Fatalf("request %d: %v", i, errs[i])
		case r.Status == http.StatusOK:
			run.admitted[i%len(nodes)]++
		case r.Status == http.StatusTooManyRequests:
			run.denied[i%len(nodes)]++
		default:
			t.Fatalf("request %d: status %d, body %q", i, r.Status, r.Body)
		}
	}
	return run
}

func quotaSum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// TestQuotaFleet: three Caddy nodes sharing one redis-server share each
// quota exactly. 50+25 requests of one key at once, spread over the nodes,
// admit exactly the month's 50; requests of cost 7 against a daily 30
// admit exactly 4. The fields report the quota and the calendar: w the
// seconds of this month in Berlin, t and a denial's Retry-After the
// seconds until it ends.
func TestQuotaFleet(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	nodes := startFleet(t, 3, quotaSite(redisBlock(r)))
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(berlin)
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, berlin)
	monthEnd := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, berlin)

	run := sendQuota(t, nodes, 75, "X-Key: tenant-1")
	t.Logf("monthly quota 50, 75 requests over 3 nodes: admitted %d %v, denied %d %v", quotaSum(run.admitted), run.admitted, quotaSum(run.denied), run.denied)
	if quotaSum(run.admitted) != 50 {
		t.Errorf("admitted %d of the month's 50", quotaSum(run.admitted))
	}
	wantPolicy := fmt.Sprintf(`"plan";q=1000;w=1, "plan.quota";q=50;w=%d`, int64(monthEnd.Sub(monthStart)/time.Second))
	for i, resp := range run.resps {
		if p := resp.Header.Get("RateLimit-Policy"); p != wantPolicy {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i, p, wantPolicy)
			break
		}
		left := int64(time.Until(monthEnd)/time.Second) + 1
		if resp.Status == http.StatusTooManyRequests {
			ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
			if err != nil || ra < left-5 || ra > left+1 {
				t.Errorf("request %d: Retry-After %q, want about %d s (until the month ends in Berlin)", i, resp.Header.Get("Retry-After"), left)
				break
			}
			if rl := resp.Header.Get("RateLimit"); !strings.Contains(rl, `"plan.quota";r=0;t=`) {
				t.Errorf("request %d: RateLimit %q, want the quota at r=0", i, rl)
				break
			}
		}
	}

	daily := sendQuota(t, nodes, 12, "X-Key: tenant-2", "X-Cost: 7")
	t.Logf("daily quota 30 at cost 7, 12 requests over 3 nodes: admitted %d %v, denied %d %v", quotaSum(daily.admitted), daily.admitted, quotaSum(daily.denied), daily.denied)
	if quotaSum(daily.admitted) != 4 {
		t.Errorf("admitted %d requests of cost 7 against a daily 30, want 4", quotaSum(daily.admitted))
	}
	// One more of cost 2 fits the day's last 2; then nothing does.
	if got := sendQuota(t, nodes[:1], 1, "X-Key: tenant-2", "X-Cost: 2"); quotaSum(got.admitted) != 1 {
		t.Errorf("the day's last 2: %d admitted", quotaSum(got.admitted))
	}
	if got := sendQuota(t, nodes[1:2], 1, "X-Key: tenant-2", "X-Cost: 1"); quotaSum(got.denied) != 1 {
		t.Errorf("after the day's 30: %d denied, want 1", quotaSum(got.denied))
	}
}

// TestQuotaMemory: one node on its memory store keeps the same quotas.
func TestQuotaMemory(t *testing.T) {
	t.Parallel()
	n := localfleet.StartNode(t, caddyBin, "", quotaSite(""))
	run := sendQuota(t, []*localfleet.Node{n}, 60, "X-Key: tenant-1")
	if quotaSum(run.admitted) != 50 || quotaSum(run.denied) != 10 {
		t.Errorf("memory store: admitted %d, denied %d of 60, want 50 and 10", quotaSum(run.admitted), quotaSum(run.denied))
	}
}
