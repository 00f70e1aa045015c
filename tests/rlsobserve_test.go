package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestRLSObserved: in a Caddy built from cmd/caddy, the service's rule
// shows as a zone does: named "rls/" and the rule's key in the metrics,
// the stats, the denial feed (the call's method and domain, the rule as
// its route) and the admin API's key lookup, and no descriptor value is a
// metric label; but a rule with detailed_metric has a zone per value, at
// most 1000, and counts the rest in its own.
func TestRLSObserved(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	rlsRules(t, dir, 2)
	detail := "domain: detail\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(dir, "detail.yaml"), []byte(detail), 0o600); err != nil {
		t.Fatal(err)
	}
	// Counts, not time: a loaded machine gets Redis seconds, so that no
	// call is decided by the local fallback.
	n, client := startRLSCaddy(t, dir, srv.Addr, `respond "ok"`, "timeout 2s")
	const ip = "192.0.2.77"
	for i, want := range []string{"OK", "OK", "OVER_LIMIT"} {
		resp, err := rlsCall(client, 10*time.Second, ip)
		if err != nil || resp.OverallCode.String() != want {
			t.Fatalf("call %d: %v %v, want %s", i, resp.GetOverallCode(), err, want)
		}
	}
	const zone = "rls/edge.remote_address"

	wantRLSZone(t, n, zone, 2, 2, 1, ip)
	checkRLSDenialInFeed(t, n, zone, "edge.remote_address", ip)
	checkDetailedMetric(t, n, client)
	wantRLSKey(t, n, zone, "remote_address="+ip, 2)
}

// wantRLSZone checks that zone shows in the node's metrics and stats with
// a rate of rate per hour, allowed calls allowed and denied ones denied,
// and that ip (a descriptor's value) is no metric label.
func wantRLSZone(t *testing.T, n *node, zone string, rate int64, allowed, denied uint64, ip string) {
	t.Helper()
	m := n.scrape()
	wantMetric(t, m, float64(allowed), "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "allowed")
	wantMetric(t, m, float64(denied), "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "denied")
	for _, s := range m {
		for name, v := range s.Labels {
			if strings.Contains(v, ip) {
				t.Errorf("%s{%s=%q}: a descriptor's value is a label", s.Name, name, v)
			}
		}
	}
	s := n.stats("")
	i := zoneIndex(s, zone)
	if i < 0 {
		t.Fatalf("no zone %s in the stats", zone)
	}
	if z := s.Zones[i]; z.Rate != rate || z.Totals["allowed"] != allowed || z.Totals["denied"] != denied {
		t.Errorf("stats of %s: rate %d, totals %v, want %d per hour, %d allowed and %d denied", zone, z.Rate, z.Totals, rate, allowed, denied)
	}
}

// wantRLSKey checks that the admin API's key lookup finds key in zone, in
// one bucket at rate per hour with nothing left.
func wantRLSKey(t *testing.T, n *node, zone, key string, rate int64) {
	t.Helper()
	st, body := n.adminDo(http.MethodGet, "/rate_limit/keys?zone="+url.QueryEscape(zone)+"&key="+url.QueryEscape(key))
	var l keyLookup
	if err := json.Unmarshal([]byte(body), &l); st != 200 || err != nil {
		t.Fatalf("key lookup: %d %v\n%s", st, err, body)
	}
	if len(l.Keys) != 1 || len(l.Keys[0].Rules) != 1 || l.Keys[0].Rules[0].Rate != rate || l.Keys[0].Rules[0].Remaining != 0 {
		t.Fatalf("key lookup of %s in %s: %s, want its bucket at %d per hour with none left", key, zone, body, rate)
	}
}

// checkRLSDenialInFeed: the feed lists the call's denial in zone with the
// call's method and domain, route, and only a digest of the key, never
// ip.
func checkRLSDenialInFeed(t *testing.T, n *node, zone, route, ip string) {
	t.Helper()
	f, body := n.waitDenials("the call's denial", "", 5*time.Second, func(f denialFeed) bool {
		for _, d := range f.Denials {
			if d.Zone == zone {
				return true
			}
		}
		return false
	})
	for _, d := range f.Denials {
		if d.Zone != zone {
			continue
		}
		if d.Method != "ShouldRateLimit" || d.Host != "edge" || d.Route != route || d.KeyDigest == "" ||
			d.Key != "" || strings.Contains(body, ip) {
			t.Errorf("the call's denial: %+v, want method ShouldRateLimit, host edge, route %s and only a digest of the key\n%s", d, route, body)
		}
	}
}

// checkDetailedMetric: a rule with detailed_metric has a zone per value,
// 1000 at most, and counts the rest in its own.
func checkDetailedMetric(t *testing.T, n *node, client rlsv3.RateLimitServiceClient) {
	t.Helper()
	detailed := func(user string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "detail", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
		}})
		if err != nil {
			t.Fatalf("detail call for %s: %v", user, err)
		}
		return resp.OverallCode.String()
	}
	if a, b := detailed("alice"), detailed("alice"); a != "OK" || b != "OVER_LIMIT" {
		t.Fatalf("alice at 1 per hour: %s then %s, want OK then OVER_LIMIT", a, b)
	}
	for i := range 1001 {
		detailed(fmt.Sprint("u", i))
	}
	m := n.scrape()
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", "rls/detail.user_alice", "outcome", "allowed")
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", "rls/detail.user_alice", "outcome", "denied")
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", "rls/detail.user_u998", "outcome", "allowed")
	wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", "rls/detail.user", "outcome", "allowed")
	perValue := m.By("zone", "caddy_rate_limit_decisions_total", "outcome", "allowed")
	n1000 := 0
	for z := range perValue {
		if strings.HasPrefix(z, "rls/detail.user_") {
			n1000++
		}
	}
	if n1000 != 1000 {
		t.Errorf("%d zones of detail.user's values, want the bound of 1000", n1000)
	}
}

// TestRLSObservedOverride: a descriptor's own limit (an override) shows as
// a zone as a rule does, named by its domain and its entries' keys, never
// their values ("rls/edge.remote_address/override"), in the metrics, the
// stats, the denial feed and the key lookup; the zones that overrides
// make are bounded with those of detailed_metric (1000), and beyond the
// bound a domain's overrides count in its own ("rls/edge/override").
func TestRLSObservedOverride(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	rlsRules(t, dir, 2)
	// Counts, not time: a loaded machine gets Redis seconds, so that no
	// call is decided by the local fallback.
	n, client := startRLSCaddy(t, dir, srv.Addr, `respond "ok"`, "timeout 2s")
	own := func(key, value string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}}
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatalf("override call for %s=%s: %v", key, value, err)
		}
		return resp.OverallCode.String()
	}
	const ip, zone = "192.0.2.88", "rls/edge.remote_address/override"
	if a, b, c := own("remote_address", ip), own("remote_address", ip), own("remote_address", "192.0.2.89"); a != "OK" || b != "OVER_LIMIT" || c != "OK" {
		t.Fatalf("two addresses at their own 1 per hour: %s, %s, %s; want OK, OVER_LIMIT, OK", a, b, c)
	}
	wantRLSZone(t, n, zone, 1, 2, 1, ip)
	checkRLSDenialInFeed(t, n, zone, "edge.remote_address/override", ip)
	wantRLSKey(t, n, zone, "remote_address="+ip, 1)

	// A zone per descriptor's keys, 1000 at most (less the one above),
	// then the domain's.
	for i := range 1001 {
		own(fmt.Sprint("k", i), "v")
	}
	m := n.scrape()
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", "rls/edge.k998/override", "outcome", "allowed")
	wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", "rls/edge/override", "outcome", "allowed")
	made := 0
	for z := range m.By("zone", "caddy_rate_limit_decisions_total", "outcome", "allowed") {
		if strings.HasPrefix(z, "rls/edge.") && strings.HasSuffix(z, "/override") {
			made++
		}
		if strings.Contains(z, ip) || strings.Contains(z, "_v") {
			t.Errorf("zone %q holds a descriptor's value", z)
		}
	}
	if made != 1000 {
		t.Errorf("%d zones of overrides, want the bound of 1000", made)
	}
}
