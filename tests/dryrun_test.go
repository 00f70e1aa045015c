package tests

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// dryRunSite has three handlers' worth of zones, on the store of redis
// (empty: the memory store):
//   - /trial: a dry-run zone, rate 10 1m (burst 10);
//   - /mixed: an enforced zone (rate 5 1m) next to a dry-run one (rate 2 1m)
//     in the same request;
//   - /all/*: a handler with dry_run, which makes both its zones
//     (rate 2 1m and rate 3 1m) dry runs.
func dryRunSite(redis string) string {
	return fmt.Sprintf(`
	route {
		handle /all/* {
			rate_limit {
				%[1]s
				key_digest_secret %[2]s
				dry_run
				zone all_a {
					key {header.X-Key}
					rate 2 1m
				}
				zone all_b {
					key {header.X-Key}
					rate 3 1m
				}
			}
			respond "ok"
		}
		handle {
			rate_limit {
				%[1]s
				key_digest_secret %[2]s
				zone trial {
					key {header.X-Key}
					rate 10 1m
					dry_run
					match {
						path /trial
					}
				}
				zone strict {
					key {header.X-Key}
					rate 5 1m
					match {
						path /mixed
					}
				}
				zone shadow {
					key {header.X-Key}
					rate 2 1m
					dry_run
					match {
						path /mixed
					}
				}
			}
			respond "ok"
		}
	}`, redis, digestSecret)
}

// TestDryRun: a dry-run zone decides and counts as if enforced but denies
// nothing and sends no rate limit fields; its would-be denials are counted
// under dry_run_denied (metrics and stats) and logged at info, at most once
// per key and zone a second. An enforced zone beside a dry-run zone in the
// same request denies as usual and sends its own fields only, and dry_run
// at the handler level makes every zone of the handler a dry run. Memory
// store and Redis.
func TestDryRun(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, redis string) {
		n := startCaddy(t, "", dryRunSite(redis))
		t.Run("zone", func(t *testing.T) { testDryRunZone(t, n) })
		t.Run("beside_enforced", func(t *testing.T) { testDryRunBesideEnforced(t, n, redis == "") })
		t.Run("handler", func(t *testing.T) { testDryRunHandler(t, n) })
	})
}

// testDryRunZone sends 30 requests of one key to a dry-run zone of burst
// 10: all pass without fields, 10 are allowed and 20 would have been
// denied (unless the 6 s refill of a token came within the run).
func testDryRunZone(t *testing.T, n *node) {
	const key = "dry-k1"
	start := time.Now()
	var firstWould time.Time
	for i := 1; i <= 30; i++ {
		if i == 11 {
			firstWould = time.Now()
		}
		r := n.get("/trial", "X-Key: "+key)
		if r.Status != 200 || r.Body != "ok" {
			t.Fatalf("request %d to a dry-run zone: %d %q, want 200 ok", i, r.Status, r.Body)
		}
		wantNoLimitFields(t, fmt.Sprintf("request %d to a dry-run zone", i), r.Header)
	}
	end := time.Now()
	elapsed := end.Sub(start)
	// One token every 6 s: a slow run may have had a token or two more.
	refilled := int(elapsed / (6 * time.Second))
	allowed, would := zoneOutcomes(t, n, "trial")
	t.Logf("30 requests in %v: allowed %v, dry_run_denied %v", elapsed.Round(time.Millisecond), allowed, would)
	if allowed+would != 30 || allowed < 10 || allowed > float64(10+refilled) {
		t.Errorf("dry-run zone of burst 10, 30 requests in %v: allowed %v and dry_run_denied %v, want 10 and 20 (at most %d refilled)",
			elapsed, allowed, would, refilled)
	}

	// The would-deny line: at least one, at most one per key and zone a
	// second of the node's clock.
	waitDryRunLine(t, n, "trial")
	settleLog(n)
	lines := dryRunLines(t, n.log.String(), "trial")
	spanned := int(end.Unix()-firstWould.Unix()) + 1 // the seconds the would-be denials fell in
	t.Logf("%d would-deny lines for 20 would-be denials over %d wall-clock seconds", len(lines), spanned)
	if len(lines) < 1 || len(lines) > spanned {
		t.Errorf("%d would-deny lines for one key over %d seconds, want 1 to %d:\n%s", len(lines), spanned, spanned, n.log.String())
	}
	seconds := map[int64]bool{}
	for _, l := range lines {
		if l["level"] != "info" || l["logger"] != "http.handlers.rate_limit" || l["key_digest"] != keyDigest(key) {
			t.Errorf("would-deny line: %v (want level info, logger http.handlers.rate_limit, key_digest %s)", l, keyDigest(key))
		}
		if _, ok := l["key"]; ok {
			t.Errorf("would-deny line shows the key without log_key: %v", l)
		}
		ts, _ := l["ts"].(float64)
		sec := int64(math.Floor(ts))
		if seconds[sec] {
			t.Errorf("two would-deny lines for one key and zone in second %d: %v", sec, lines)
		}
		seconds[sec] = true
	}
	for _, l := range deniedLines(t, n.log.String()) {
		if l["zone"] == "trial" {
			t.Errorf("a dry-run zone logged a denial: %v", l)
		}
	}
}

// testDryRunBesideEnforced: strict (enforced, 5 a minute) and shadow (dry
// run, 2 a minute) apply to every request of /mixed. strict admits 5 and
// denies the rest with its own fields only; shadow denies nothing and sends
// no fields, lets 2 through and counts the 3rd to 5th as dry_run_denied.
// On the requests strict denies, shadow is consulted too on the memory
// store (dry_run_denied), and on Redis only when the deny cache did not
// answer for strict (it learned strict's empty bucket from the 5th answer,
// so it answers them all).
func testDryRunBesideEnforced(t *testing.T, n *node, memory bool) {
	const key = "dry-m1"
	for i := 1; i <= 10; i++ {
		r := n.get("/mixed", "X-Key: "+key)
		what := fmt.Sprintf("request %d to /mixed", i)
		want := map[string]string{
			"RateLimit-Policy":  `"strict";q=5;w=60`,
			"X-RateLimit-Limit": "5",
		}
		switch {
		case i <= 5 && r.Status != 200:
			t.Fatalf("%s: %d %q, want 200: the dry-run zone beside it must not deny", what, r.Status, r.Body)
		case i <= 5:
			want["X-RateLimit-Remaining"] = fmt.Sprint(5 - i)
		case r.Status != 429:
			t.Fatalf("%s: %d %q, want 429 from the enforced zone", what, r.Status, r.Body)
		default:
			want["X-RateLimit-Remaining"] = "0"
			if r.Header.Get("Retry-After") == "" {
				t.Errorf("%s: a denial without Retry-After: %v", what, r.Header)
			}
		}
		wantFields(t, what, r.Header, want)
		if rl := r.Header.Get("RateLimit"); !strings.HasPrefix(rl, `"strict";`) || strings.Contains(rl, "shadow") {
			t.Errorf("%s: RateLimit %q, want the enforced zone's state only", what, rl)
		}
		if i == 5 {
			m := n.scrape()
			wantMetric(t, m, 5, "caddy_rate_limit_decisions_total", "zone", "strict", "outcome", "allowed")
			wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", "shadow", "outcome", "allowed")
			wantMetric(t, m, 3, "caddy_rate_limit_decisions_total", "zone", "shadow", "outcome", "dry_run_denied")
		}
	}
	m := n.scrape()
	wantMetric(t, m, 5, "caddy_rate_limit_decisions_total", "zone", "strict", "outcome", "allowed")
	wantMetric(t, m, 5, "caddy_rate_limit_decisions_total", "zone", "strict", "outcome", "denied")
	allowed, would := zoneOutcomes(t, n, "shadow")
	t.Logf("shadow after 10 requests (strict denied 5): allowed %v, dry_run_denied %v", allowed, would)
	lo, hi := float64(3), float64(8)
	if memory {
		lo = 8
	}
	if allowed != 2 || would < lo || would > hi {
		t.Errorf("shadow after 10 requests: allowed %v, dry_run_denied %v, want 2 and %v to %v", allowed, would, lo, hi)
	}
	waitDryRunLine(t, n, "shadow")
	for _, l := range deniedLines(t, n.log.String()) {
		if l["zone"] == "shadow" {
			t.Errorf("a dry-run zone logged a denial: %v", l)
		}
	}
}

// testDryRunHandler: with dry_run at the handler level, both zones are dry
// runs: 6 requests all pass without fields; all_a (2 a minute) counts 2
// allowed and 4 would-be denials, all_b (3) 3 and 3, each charged for the
// requests it admitted although the other would have denied them.
func testDryRunHandler(t *testing.T, n *node) {
	const key = "dry-h1"
	for i := 1; i <= 6; i++ {
		r := n.get("/all/x", "X-Key: "+key)
		if r.Status != 200 {
			t.Fatalf("request %d to a handler with dry_run: %d %q, want 200", i, r.Status, r.Body)
		}
		wantNoLimitFields(t, fmt.Sprintf("request %d to a handler with dry_run", i), r.Header)
	}
	m := n.scrape()
	wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", "all_a", "outcome", "allowed")
	wantMetric(t, m, 4, "caddy_rate_limit_decisions_total", "zone", "all_a", "outcome", "dry_run_denied")
	wantMetric(t, m, 3, "caddy_rate_limit_decisions_total", "zone", "all_b", "outcome", "allowed")
	wantMetric(t, m, 3, "caddy_rate_limit_decisions_total", "zone", "all_b", "outcome", "dry_run_denied")
	for _, z := range []string{"all_a", "all_b"} {
		wantMetric(t, m, 0, "caddy_rate_limit_decisions_total", "zone", z, "outcome", "denied")
		tot := zoneTotalsOf(t, n, z)
		if tot["denied"] != 0 || tot["dry_run_denied"] == 0 {
			t.Errorf("zone %s stats totals %v: want dry_run_denied and no denied", z, tot)
		}
	}
	waitDryRunLine(t, n, "all_a")
	waitDryRunLine(t, n, "all_b")
}

// dryRunMessage is the log message of a dry-run zone's would-be denial.
const dryRunMessage = "rate limit dry run: would deny"

// dryRunLines returns the JSON log lines of zone's would-be denials.
func dryRunLines(t *testing.T, log, zone string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range logLines(t, log, dryRunMessage) {
		if l["zone"] == zone {
			lines = append(lines, l)
		}
	}
	return lines
}

// waitDryRunLine waits up to 10 s for a would-deny line of zone in the
// node's output.
func waitDryRunLine(t *testing.T, n *node, zone string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(dryRunLines(t, n.log.String(), zone)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no would-deny line for zone %s:\n%s", zone, n.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// zoneOutcomes returns a zone's allowed and dry_run_denied counts, and
// fails the test unless the metrics and the stats JSON agree on them.
func zoneOutcomes(t *testing.T, n *node, zone string) (allowed, would float64) {
	t.Helper()
	m := n.scrape()
	allowed, _ = metric(m, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "allowed")
	would, _ = metric(m, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "dry_run_denied")
	if denied, _ := metric(m, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "denied"); denied != 0 {
		t.Errorf("dry-run zone %s: %v denied in the metrics", zone, denied)
	}
	tot := zoneTotalsOf(t, n, zone)
	if float64(tot["allowed"]) != allowed || float64(tot["dry_run_denied"]) != would || tot["denied"] != 0 {
		t.Errorf("zone %s: stats totals %v, metrics allowed %v and dry_run_denied %v", zone, tot, allowed, would)
	}
	return allowed, would
}

// zoneTotalsOf returns a zone's totals from the node's stats JSON.
func zoneTotalsOf(t *testing.T, n *node, zone string) map[string]uint64 {
	t.Helper()
	s := n.stats("?series=0")
	i := zoneIndex(s, zone)
	if i < 0 {
		t.Fatalf("zone %s is not in the stats", zone)
	}
	return s.Zones[i].Totals
}

// wantNoLimitFields fails the test when a response carries any rate limit
// field: RateLimit*, X-RateLimit-* or Retry-After.
func wantNoLimitFields(t *testing.T, what string, h http.Header) {
	t.Helper()
	for name := range h {
		l := strings.ToLower(name)
		if strings.HasPrefix(l, "ratelimit") || strings.HasPrefix(l, "x-ratelimit") || l == "retry-after" {
			t.Errorf("%s: field %s: %q, want no rate limit fields", what, name, h[name])
		}
	}
}
