package tests

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The rules of the fleet test: tenants on the reference's fixed window,
// users on a token bucket (an extension); and the tally, a request's own
// limit (an override) far above what the load sends, that every call puts
// on its tenant's or user's entries beside them.
const (
	tenantLimit = 50 // per second, fixed window
	userRate    = 40 // per second, token bucket
	userBurst   = 20
	tallyLimit  = 1_000_000 // per hour
)

var rlsFleetRules = fmt.Sprintf(`domain: fleet
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: %d}
  - key: user
    rate_limit: {unit: second, requests_per_unit: %d, algorithm: token_bucket, burst: %d}
`, tenantLimit, userRate, userBurst)

// rlsFleetWindows is how many one-second windows the load fills, and
// rlsFleetCallers how many calls are in flight at once: two per bucket,
// each a few hundred calls a second, most of them denied at once from a
// node's deny cache, saturate every bucket.
const (
	rlsFleetWindows = 3
	rlsFleetCallers = 8
)

// TestRLSFleetExactness is issue 33's fleet promise for Envoy's calls:
// three Caddy nodes running rate_limit_rls on one Redis (single, then a
// Cluster of three masters) admit, for every descriptor's bucket, at most
// the exact bound (a fixed window: requests_per_unit per window the load
// touched; a token bucket: burst + rate x elapsed) and at least 0.98 of it,
// under a saturating load of Envoy-like calls (unary, a 20ms deadline,
// three descriptors each) spread over the nodes.
//
// The callers count a bucket's admissions from the OK answers. A call the
// fleet admitted but answered too late (past the caller's deadline, or by
// the on_error policy once the decision had waited its 10ms) is an
// admission no caller saw: each call also names its bucket's tally, which
// never denies, so what Redis charged the tally is what the fleet admitted
// of the bucket (all-or-nothing: a call the bucket denied charged no
// tally). The tally is a descriptor with the bucket's own entries and a
// limit of its own (an override), so its bucket has the same client key,
// and so the same Cluster hash tag and slot, as the bucket it counts: on
// a Cluster as on a single Redis, the two are decided in one atomic script
// call, and the tally counts exactly what Redis admitted of the bucket.
// The OK answers and the tally must stay within the bound, the tally must
// reach 0.98 of it, and it lies between the OK answers and those plus the
// calls of unknown outcome.
//
// The nodes answer a decision Redis has not made within half the call's
// deadline with on_error deny, so that every admission is Redis'. Their
// breaker never opens: on a machine that also runs the load and every
// process, five decisions in a row can miss 10ms without any fault, and an
// open breaker fails a node closed for a second, which would measure the
// machine, not the fleet's exactness. The test runs alone (not parallel)
// for the same reason.
func TestRLSFleetExactness(t *testing.T) {
	for _, top := range []string{"single", "cluster"} {
		t.Run(top, func(t *testing.T) {
			var addrs string
			if top == "single" {
				addrs = redistest.Start(t).Addr
			} else {
				addrs = strings.Join(redistest.StartCluster(t, 3).Addrs(), " ")
			}
			clients := startRLSFleet(t, 3, addrs)
			waitWindow(time.Hour, 30*time.Second) // the tallies count in one window
			rep := rlsFleetLoad(clients, rlsFleetCallers, rlsFleetWindows)
			t.Logf("%s Redis, 3 nodes, %d callers, %d windows of 1s: %d calls (%.0f/s), %d OK, %d OVER_LIMIT, %d answered by on_error deny, %d missed the 20ms deadline, %d errors (first: %s)",
				top, rlsFleetCallers, rlsFleetWindows, rep.calls, float64(rep.calls)/rep.last.Sub(rep.first).Seconds(), rep.ok, rep.over, rep.policy, rep.missed, rep.errs, rep.firstErr)
			time.Sleep(time.Second) // a Cluster's refunds are queued
			for b, bs := range rep.buckets {
				key, value, _ := strings.Cut(b, "=")
				bs.tally = tallyLimit - int64(lookTally(t, clients[0], key, value))
			}
			rep.check(t)
		})
	}
}

// startRLSFleet starts count Caddy nodes running rate_limit_rls on the
// Redis at addrs with rlsFleetRules, and returns a client of each.
func startRLSFleet(t *testing.T, count int, addrs string) []rlsv3.RateLimitServiceClient {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fleet.yaml"), []byte(rlsFleetRules), 0o600); err != nil {
		t.Fatal(err)
	}
	clients := make([]rlsv3.RateLimitServiceClient, count)
	var wg sync.WaitGroup
	for i := range clients {
		port := redistest.FreePort(t)
		globals := fmt.Sprintf(`	rate_limit_rls {
		listen 127.0.0.1:%d
		config_dir %s
		on_error deny
		redis {
			address %s
			breaker_failures 1000000
		}
	}`, port, dir, addrs)
		wg.Go(func() { localfleet.StartNode(t, caddyBin, globals, `respond "ok"`) })
		clients[i] = rlsClient(t, port)
	}
	wg.Wait()
	// Each node connected, to Redis too: a patient call to each.
	for i, cl := range clients {
		if _, err := lookTallyErr(cl, "tenant", "warm"); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	return clients
}

// waitWindow waits, when the current window of unit ends within room,
// until the next one starts.
func waitWindow(unit, room time.Duration) {
	if left := unit - time.Duration(time.Now().UnixNano())%unit; left < room {
		time.Sleep(left + 10*time.Millisecond)
	}
}

// lookTally returns the limit_remaining of the tally of the bucket of
// key=value, by a call that only looks (its descriptor's hits_addend 0).
func lookTally(t *testing.T, cl rlsv3.RateLimitServiceClient, key, value string) uint32 {
	t.Helper()
	left, err := lookTallyErr(cl, key, value)
	if err != nil {
		t.Fatal(err)
	}
	return left
}

func lookTallyErr(cl rlsv3.RateLimitServiceClient, key, value string) (uint32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := tallyDescriptor(key, value)
	d.HitsAddend = wrapperspb.UInt64(0)
	resp, err := cl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fleet", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		return 0, fmt.Errorf("looking at the tally of %s=%s: %w", key, value, err)
	}
	return resp.Statuses[0].LimitRemaining, nil
}

func rlsDescriptor(key, value string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

// tallyDescriptor returns the tally of the bucket of key=value: the
// bucket's entries with a limit of tallyLimit per hour of their own, whose
// bucket shares the client key (and so the Cluster slot) of the bucket.
func tallyDescriptor(key, value string) *ratelimitv3.RateLimitDescriptor {
	d := rlsDescriptor(key, value)
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: tallyLimit, Unit: typev3.RateLimitUnit_HOUR}
	return d
}

// rlsFleetReport is what the load's callers saw.
type rlsFleetReport struct {
	calls, ok, over, policy, missed, errs int64
	firstErr                              string
	buckets                               map[string]*rlsBucket // by "tenant=t0"
	// first is when the first call was sent, last when the last was
	// answered; planned is how long the load was meant to fill.
	first, last time.Time
	planned     time.Duration
}

// rlsBucket is one descriptor bucket's figures.
type rlsBucket struct {
	ok      int64 // OK answers
	unknown int64 // calls answered too late, or by the on_error policy
	tally   int64 // what Redis charged the bucket's tally
}

// rlsFleetLoad runs callers closed-loop callers, each on the nodes in turn,
// from the start of the next second for windows seconds (less 25ms, so
// that the calls in flight end in the last window). Half the callers send
// a tenant's calls, half a user's: [tenant or user, its tally, a route
// that no rule matches].
func rlsFleetLoad(clients []rlsv3.RateLimitServiceClient, callers, windows int) *rlsFleetReport {
	start := time.Now().Truncate(time.Second).Add(time.Second)
	stop := start.Add(time.Duration(windows)*time.Second - 25*time.Millisecond)
	rep := &rlsFleetReport{buckets: map[string]*rlsBucket{}, first: start, last: start, planned: stop.Sub(start)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range callers {
		key, value := "tenant", fmt.Sprintf("t%d", c/2%2)
		if c%2 == 1 {
			key, value = "user", fmt.Sprintf("u%d", c/2%2)
		}
		bucket := key + "=" + value
		wg.Go(func() {
			req := &rlsv3.RateLimitRequest{Domain: "fleet", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				rlsDescriptor(key, value), tallyDescriptor(key, value), rlsDescriptor("route", "/api"),
			}}
			var mine rlsFleetReport
			var last time.Time
			time.Sleep(time.Until(start))
			for i := c; time.Now().Before(stop); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, req)
				cancel()
				last = time.Now()
				mine.calls++
				switch {
				case err != nil && ctx.Err() != nil:
					mine.missed++
				case err != nil:
					mine.errs++
					if mine.firstErr == "" {
						mine.firstErr = err.Error()
					}
				case resp.Statuses[1].Code == rlsv3.RateLimitResponse_OVER_LIMIT:
					// The tally is far from its limit: the call was
					// answered by the policy, not by Redis. (A node's
					// deny cache leaves the tally OK, unasked: a denial.)
					mine.policy++
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					mine.ok++
				default:
					mine.over++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			rep.calls += mine.calls
			rep.ok += mine.ok
			rep.over += mine.over
			rep.policy += mine.policy
			rep.missed += mine.missed
			rep.errs += mine.errs
			if rep.firstErr == "" {
				rep.firstErr = mine.firstErr
			}
			bs := rep.buckets[bucket]
			if bs == nil {
				bs = &rlsBucket{}
				rep.buckets[bucket] = bs
			}
			bs.ok += mine.ok
			bs.unknown += mine.policy + mine.missed + mine.errs
			if last.After(rep.last) {
				rep.last = last
			}
		})
	}
	wg.Wait()
	return rep
}

// check compares each bucket's admissions, the OK answers and its tally in
// Redis, with its exact bound, and its tally with 0.98 of the bound over
// the windows (or the time) the load filled.
func (r *rlsFleetReport) check(t *testing.T) {
	t.Helper()
	span := r.last.Sub(r.first)
	// The fixed windows the calls' decisions may have fallen in: those of
	// the span from the first call's sending to the last one's answer.
	touched := r.last.Unix() - r.first.Unix() + 1
	var lines []string
	names := make([]string, 0, len(r.buckets))
	for b := range r.buckets {
		names = append(names, b)
	}
	sort.Strings(names)
	for _, b := range names {
		bs := r.buckets[b]
		var bound, least float64
		if strings.HasPrefix(b, "tenant=") {
			bound = float64(tenantLimit * touched)
			least = 0.98 * float64(tenantLimit*rlsFleetWindows)
		} else {
			bound = userBurst + userRate*span.Seconds()
			least = 0.98 * (userBurst + userRate*r.planned.Seconds())
		}
		lines = append(lines, fmt.Sprintf("%-10s OK %4d (%.3f of the bound), in Redis %4d (%.3f), exact bound %6.1f, at least %6.1f; %d calls of unknown outcome",
			b, bs.ok, float64(bs.ok)/bound, bs.tally, float64(bs.tally)/bound, bound, least, bs.unknown))
		if float64(bs.ok) > math.Floor(bound+1e-9) {
			t.Errorf("%s: %d answered OK, above the exact bound %.1f", b, bs.ok, bound)
		}
		if float64(bs.tally) > math.Floor(bound+1e-9) {
			t.Errorf("%s: %d admitted in Redis, above the exact bound %.1f", b, bs.tally, bound)
		}
		if float64(bs.tally) < least {
			t.Errorf("%s: %d admitted in Redis, below 0.98 of the bound (%.1f): the fleet did not give what the rule gives", b, bs.tally, least)
		}
		if bs.tally < bs.ok || bs.tally > bs.ok+bs.unknown {
			t.Errorf("%s: Redis charged the tally %d, want between the %d calls answered OK and %d (those and the %d of unknown outcome): denied calls were charged",
				b, bs.tally, bs.ok, bs.ok+bs.unknown, bs.unknown)
		}
	}
	t.Logf("span %s, %d windows touched:\n%s", span.Round(time.Millisecond), touched, strings.Join(lines, "\n"))
}
