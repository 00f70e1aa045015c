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
	n, client := startRLSCaddy(t, dir, srv.Addr, `respond "ok"`)
	const ip = "192.0.2.77"
	for i, want := range []string{"OK", "OK", "OVER_LIMIT"} {
		resp, err := rlsCall(client, 10*time.Second, ip)
		if err != nil || resp.OverallCode.String() != want {
			t.Fatalf("call %d: %v %v, want %s", i, resp.GetOverallCode(), err, want)
		}
	}
	const zone = "rls/edge.remote_address"

	m := n.scrape()
	wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "allowed")
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "denied")
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
	if z := s.Zones[i]; z.Rate != 2 || z.Totals["allowed"] != 2 || z.Totals["denied"] != 1 {
		t.Errorf("stats of %s: rate %d, totals %v, want 2 per hour, 2 allowed and 1 denied", zone, z.Rate, z.Totals)
	}

	checkRLSDenialInFeed(t, n, zone, ip)
	checkDetailedMetric(t, n, client)

	st, body := n.adminDo(http.MethodGet, "/rate_limit/keys?zone="+url.QueryEscape(zone)+"&key="+url.QueryEscape("remote_address="+ip))
	if st != 200 {
		t.Fatalf("key lookup: %d %s", st, body)
	}
	var l keyLookup
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("key lookup: %v\n%s", err, body)
	}
	if len(l.Keys) != 1 || len(l.Keys[0].Rules) != 1 || l.Keys[0].Rules[0].Rate != 2 || l.Keys[0].Rules[0].Remaining != 0 {
		t.Fatalf("key lookup of the descriptor: %s, want its bucket at 2 per hour with none left", body)
	}
}

// checkRLSDenialInFeed: the feed lists the call's denial in zone with the
// call's method and domain, the rule as its route, and only a digest of
// the key, never ip.
func checkRLSDenialInFeed(t *testing.T, n *node, zone, ip string) {
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
		if d.Method != "ShouldRateLimit" || d.Host != "edge" || d.Route != "edge.remote_address" || d.KeyDigest == "" ||
			d.Key != "" || strings.Contains(body, ip) {
			t.Errorf("the call's denial: %+v, want method ShouldRateLimit, host edge, route edge.remote_address and only a digest of the key\n%s", d, body)
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
	n, client := startRLSCaddy(t, dir, srv.Addr, `respond "ok"`)
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
	m := n.scrape()
	wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "allowed")
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "denied")
	s := n.stats("")
	if i := zoneIndex(s, zone); i < 0 {
		t.Errorf("no zone %s in the stats", zone)
	} else if z := s.Zones[i]; z.Rate != 1 || z.Totals["allowed"] != 2 || z.Totals["denied"] != 1 {
		t.Errorf("stats of %s: rate %d, totals %v, want 1 per hour, 2 allowed and 1 denied", zone, z.Rate, z.Totals)
	}
	f, body := n.waitDenials("the override's denial", "", 5*time.Second, func(f denialFeed) bool {
		for _, d := range f.Denials {
			if d.Zone == zone {
				return true
			}
		}
		return false
	})
	for _, d := range f.Denials {
		if d.Zone == zone && (d.Method != "ShouldRateLimit" || d.Host != "edge" || d.Route != "edge.remote_address/override" || d.Key != "") {
			t.Errorf("the override's denial: %+v, want method ShouldRateLimit, host edge, route edge.remote_address/override and no key", d)
		}
	}
	if strings.Contains(body, ip) {
		t.Errorf("the denial feed shows the descriptor's value:\n%s", body)
	}
	st, body := n.adminDo(http.MethodGet, "/rate_limit/keys?zone="+url.QueryEscape(zone)+"&key="+url.QueryEscape("remote_address="+ip))
	var l keyLookup
	if err := json.Unmarshal([]byte(body), &l); st != 200 || err != nil {
		t.Fatalf("key lookup: %d %v\n%s", st, err, body)
	}
	if len(l.Keys) != 1 || len(l.Keys[0].Rules) != 1 || l.Keys[0].Rules[0].Rate != 1 || l.Keys[0].Rules[0].Remaining != 0 {
		t.Fatalf("key lookup of the override: %s, want its bucket at 1 per hour with none left", body)
	}

	// A zone per descriptor's keys, 1000 at most (less the one above),
	// then the domain's.
	for i := range 1001 {
		own(fmt.Sprint("k", i), "v")
	}
	m = n.scrape()
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
