package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// adminGet fetches a path from the node's admin endpoint.
func (n *node) adminGet(path string) string {
	n.t.Helper()
	resp, err := http.Get("http://" + n.Admin + path)
	if err != nil {
		n.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		n.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return string(body)
}

// scrape reads Caddy's metrics endpoint on the admin listener.
func (n *node) scrape() localfleet.Metrics {
	n.t.Helper()
	m, err := n.Metrics()
	if err != nil {
		n.t.Fatalf("scraping metrics: %v", err)
	}
	return m
}

// metric returns the sum of the samples of name whose labels include the
// given pairs, and whether there was any.
func metric(all localfleet.Metrics, name string, labels ...string) (float64, bool) {
	sum, found := all.By("", name, labels...)[""]
	return sum, found
}

func wantMetric(t *testing.T, all localfleet.Metrics, want float64, name string, labels ...string) {
	t.Helper()
	if got, _ := metric(all, name, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// stats is the part of GET /rate_limit/stats the tests read.
type stats struct {
	Node  string `json:"node"`
	Zones []struct {
		Name          string                        `json:"name"`
		Rate          int64                         `json:"rate"`
		Store         string                        `json:"store"`
		Totals        map[string]uint64             `json:"totals"`
		DenyCacheHits uint64                        `json:"deny_cache_hits"`
		Rates         map[string]map[string]float64 `json:"rates"`
		TopDenied     struct {
			Hashed bool `json:"hashed"`
			Keys   []struct {
				Key    string `json:"key"`
				Denied uint64 `json:"denied"`
			} `json:"keys"`
		} `json:"top_denied"`
		Series *struct {
			Allowed []uint64 `json:"allowed"`
			Denied  []uint64 `json:"denied"`
		} `json:"series"`
		Fleet *struct {
			Nodes  []string          `json:"nodes"`
			Totals map[string]uint64 `json:"totals"`
			Error  string            `json:"error"`
		} `json:"fleet"`
	} `json:"zones"`
	Stores []struct {
		Name    string            `json:"name"`
		Kind    string            `json:"kind"`
		Status  string            `json:"status"`
		Breaker string            `json:"breaker"`
		Errors  map[string]uint64 `json:"errors"`
		Latency *struct {
			Calls uint64  `json:"calls"`
			P50   float64 `json:"p50"`
			P99   float64 `json:"p99"`
		} `json:"latency_ms"`
	} `json:"stores"`
}

func (n *node) stats(query string) stats {
	n.t.Helper()
	var s stats
	body := n.adminGet("/rate_limit/stats" + query)
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		n.t.Fatalf("stats: %v\n%s", err, body)
	}
	return s
}

func zoneIndex(s stats, name string) int {
	for i := range s.Zones {
		if s.Zones[i].Name == name {
			return i
		}
	}
	return -1
}

// TestMetricsAfterKnownLoad sends a known load through a real Caddy and
// reads the counts back from Caddy's /metrics and from the stats API; the
// counters keep counting across a reload, and a zone that leaves the
// configuration leaves the metrics.
func TestMetricsAfterKnownLoad(t *testing.T) {
	t.Parallel()
	site := func(zones, body string) string {
		return fmt.Sprintf(`
	rate_limit {
		key_digest_secret test-digest-secret
		zone obs_api {
			key {header.X-Key}
			rate 5 1h
		}
		%s
	}
	header >X-Left {http.rate_limit.obs_api.remaining}
	respond %q`, zones, body)
	}
	login := `zone obs_login {
			key {header.X-Key}
			rate 2 1h
			match {
				path /login
			}
		}`
	n := startCaddy(t, "", site(login, "remaining={http.rate_limit.obs_api.remaining} limit={http.rate_limit.obs_api.limit}"))

	// a: 8 requests, 5 allowed and 3 denied by obs_api.
	for i := range 8 {
		r := n.get("/", "X-Key: a")
		if i < 5 && (r.Status != 200 || r.Body != fmt.Sprintf("remaining=%d limit=5", 4-i) || r.Header.Get("X-Left") != strconv.Itoa(4-i)) {
			t.Fatalf("a %d: %d %q X-Left %q", i, r.Status, r.Body, r.Header.Get("X-Left"))
		}
		if i >= 5 && r.Status != 429 {
			t.Fatalf("a %d: %d, want 429", i, r.Status)
		}
	}
	// b on /login: both zones apply; obs_login admits 2 and denies the
	// third, which obs_api would have admitted: it counts as denied in
	// obs_login and not at all in obs_api.
	if got := n.statuses(3, "/login", "X-Key: b"); got[200] != 2 || got[429] != 1 {
		t.Fatalf("b: %v", got)
	}
	m := n.scrape()
	wantMetric(t, m, 7, "caddy_rate_limit_decisions_total", "zone", "obs_api", "outcome", "allowed")
	wantMetric(t, m, 3, "caddy_rate_limit_decisions_total", "zone", "obs_api", "outcome", "denied")
	wantMetric(t, m, 2, "caddy_rate_limit_decisions_total", "zone", "obs_login", "outcome", "allowed")
	wantMetric(t, m, 1, "caddy_rate_limit_decisions_total", "zone", "obs_login", "outcome", "denied")
	wantMetric(t, m, 0, "caddy_rate_limit_decisions_total", "outcome", "failed_open")
	for _, s := range m {
		for _, v := range s.Labels {
			if v == "a" || v == "b" {
				t.Errorf("a client key is a label value: %s %v", s.Name, s.Labels)
			}
		}
	}

	checkKnownLoadInStats(t, n)

	// A reload that keeps obs_api and drops obs_login.
	n.reload("", site("", "v2"))
	if r := n.get("/", "X-Key: c"); r.Status != 200 || r.Body != "v2" {
		t.Fatalf("after the reload: %d %q", r.Status, r.Body)
	}
	m = n.scrape()
	wantMetric(t, m, 8, "caddy_rate_limit_decisions_total", "zone", "obs_api", "outcome", "allowed")
	if _, ok := metric(m, "caddy_rate_limit_decisions_total", "zone", "obs_login"); ok {
		t.Error("obs_login left the configuration but not the metrics")
	}
	if zoneIndex(n.stats("?series=0"), "obs_login") >= 0 {
		t.Error("obs_login left the configuration but not the stats")
	}
}

// checkKnownLoadInStats: the stats count TestMetricsAfterKnownLoad's
// load as the metrics do, and the top denied key is a's digest.
func checkKnownLoadInStats(t *testing.T, n *node) {
	t.Helper()
	// Wait for the second to end so the 60 s window holds all of it.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	s := n.stats("")
	i := zoneIndex(s, "obs_api")
	if i < 0 {
		t.Fatalf("no obs_api in the stats: %+v", s)
	}
	z := s.Zones[i]
	if z.Totals["allowed"] != 7 || z.Totals["denied"] != 3 || z.Store != "memory" {
		t.Errorf("obs_api stats: totals %v store %q", z.Totals, z.Store)
	}
	if got := z.Rates["60s"]["allowed"] * 60; got < 6.99 || got > 7.01 {
		t.Errorf("60 s rate of allowed: %v per second, want 7/60", z.Rates["60s"]["allowed"])
	}
	var allowed, denied uint64
	for j := range z.Series.Allowed {
		allowed += z.Series.Allowed[j]
		denied += z.Series.Denied[j]
	}
	if allowed != 7 || denied != 3 {
		t.Errorf("series sum to %d allowed and %d denied, want 7 and 3", allowed, denied)
	}
	if len(z.TopDenied.Keys) != 1 || z.TopDenied.Keys[0].Key != keyDigest("a") || z.TopDenied.Keys[0].Denied != 3 {
		t.Errorf("top denied %+v, want a's digest, 3", z.TopDenied)
	}
}

// TestDisableMetricsInCaddy: a handler with disable_metrics adds nothing to
// the metrics or the stats, and its placeholders still work.
func TestDisableMetricsInCaddy(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone quiet {
			rate 1 1h
		}
		disable_metrics
	}
	respond "limit={http.rate_limit.quiet.limit}"`)
	if r := n.get("/"); r.Status != 200 || r.Body != "limit=1" {
		t.Fatalf("%d %q", r.Status, r.Body)
	}
	n.get("/")
	if _, ok := metric(n.scrape(), "caddy_rate_limit_decisions_total", "zone", "quiet"); ok {
		t.Error("metrics of a handler with disable_metrics")
	}
	if s := n.stats(""); len(s.Zones) != 0 {
		t.Errorf("stats of a handler with disable_metrics: %+v", s.Zones)
	}
}

// TestRedisStoreMetrics: with Redis, every decision is either a store call
// (timed in the histogram) or a deny cache hit; with Redis gone, decisions
// fail open, errors are counted by reason, and the breaker gauge opens.
func TestRedisStoreMetrics(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 1s
			breaker_failures 3
			breaker_cooldown 5s
		}
		zone obs_redis {
			key {header.X-Key}
			rate 3 1h
			on_error allow
		}
	}
	respond "ok"`, r.Addr))
	store := "redis:" + r.Addr
	if got := n.statuses(10, "/", "X-Key: k"); got[200] != 3 || got[429] != 7 {
		t.Fatalf("redis up: %v", got)
	}
	m := n.scrape()
	wantMetric(t, m, 3, "caddy_rate_limit_decisions_total", "zone", "obs_redis", "outcome", "allowed")
	wantMetric(t, m, 7, "caddy_rate_limit_decisions_total", "zone", "obs_redis", "outcome", "denied")
	calls, _ := metric(m, "caddy_rate_limit_store_duration_seconds_count", "store", store)
	hits, _ := metric(m, "caddy_rate_limit_deny_cache_hits_total", "zone", "obs_redis")
	if calls+hits != 10 || calls < 3 {
		t.Errorf("%v store calls and %v deny cache hits, want 10 in all and at least 3 calls", calls, hits)
	}
	wantMetric(t, m, 0, "caddy_rate_limit_breaker_open", "store", store)
	wantMetric(t, m, 0, "caddy_rate_limit_store_errors_total", "store", store)
	s := n.stats("?series=0")
	if len(s.Stores) != 1 || s.Stores[0].Status != "ok" || s.Stores[0].Kind != "redis" || s.Stores[0].Latency == nil ||
		s.Stores[0].Latency.Calls != uint64(calls) || s.Stores[0].Latency.P50 <= 0 {
		t.Errorf("store stats with redis up: %+v", s.Stores)
	}

	r.Stop()
	if got := n.statuses(8, "/", "X-Key: other"); got[200] != 8 {
		t.Fatalf("redis down: %v, want every request to fail open", got)
	}
	m = n.scrape()
	wantMetric(t, m, 8, "caddy_rate_limit_decisions_total", "zone", "obs_redis", "outcome", "failed_open")
	wantMetric(t, m, 1, "caddy_rate_limit_breaker_open", "store", store)
	failed, _ := metric(m, "caddy_rate_limit_store_errors_total", "store", store, "reason", "error")
	open, _ := metric(m, "caddy_rate_limit_store_errors_total", "store", store, "reason", "breaker_open")
	if failed != 3 || open != 5 {
		t.Errorf("store errors: %v errors and %v refused by the breaker, want 3 and 5", failed, open)
	}
	s = n.stats("?series=0")
	if st := s.Stores[0]; st.Status != "down" || st.Breaker != "open" || st.Errors["error"] != 3 || st.Errors["breaker_open"] != 5 {
		t.Errorf("store stats with redis down: %+v", st)
	}
}

// TestDenialEventAndLog: each denial emits rate_limit_exceeded (seen in the
// events app's debug log) and the module's debug line, with the key's
// digest and not the key.
func TestDenialEventAndLog(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "debug", `
	rate_limit {
		key_digest_secret test-digest-secret
		zone obs_event {
			key {header.X-Key}
			rate 1 1h
		}
	}
	respond "ok"`)
	if got := n.statuses(3, "/", "X-Key: sk_secret_key"); got[200] != 1 || got[429] != 2 {
		t.Fatalf("%v", got)
	}
	digest := keyDigest("sk_secret_key")
	var events, denials int
	deadline := time.Now().Add(5 * time.Second)
	for {
		events, denials = 0, 0
		for _, line := range strings.Split(n.log.String(), "\n") {
			if strings.Contains(line, `"name":"rate_limit_exceeded"`) {
				events++
				for _, want := range []string{`"zone":"obs_event"`, `"key_digest":"` + digest + `"`, `"retry_after":3600`, `"origin":"http.handlers.rate_limit"`} {
					if !strings.Contains(line, want) {
						t.Errorf("event line lacks %s: %s", want, line)
					}
				}
			}
			if strings.Contains(line, `"msg":"rate limit exceeded"`) {
				denials++
				if !strings.Contains(line, `"key_digest":"`+digest+`"`) || !strings.Contains(line, `"retry_after"`) {
					t.Errorf("denial line: %s", line)
				}
			}
			if strings.Contains(line, "rate_limit") && strings.Contains(line, "sk_secret_key") && !strings.Contains(line, `"headers"`) {
				t.Errorf("the client key appears in a line of the module: %s", line)
			}
		}
		if events >= 2 && denials >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if events != 2 || denials != 2 {
		t.Errorf("%d events and %d denial lines, want 2 each\n%s", events, denials, n.log.String())
	}
}

// TestFleetView: two nodes on one Redis; each node's stats show the fleet's
// totals, the sum of what both decided.
func TestFleetView(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	site := fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 1s
		}
		zone obs_fleet {
			key {header.X-Key}
			rate 4 1h
		}
	}
	respond "ok"`, r.Addr)
	a, b := startCaddy(t, "", site), startCaddy(t, "", site)
	var wg sync.WaitGroup
	for i, nd := range []*node{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 3 {
				nd.statuses(6, "/", fmt.Sprintf("X-Key: n%d-k%d", i, k)) // 4 allowed, 2 denied each
			}
		}()
	}
	wg.Wait()
	// Shared buckets: keys differ per node, so each node admits 12 and
	// denies 6. The reporters write within a second; the view lags two.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := a.stats("?series=60")
		i := zoneIndex(s, "obs_fleet")
		if i < 0 {
			t.Fatalf("no obs_fleet zone: %+v", s)
		}
		z := s.Zones[i]
		if z.Totals["allowed"] != 12 || z.Totals["denied"] != 6 {
			t.Fatalf("node a's own totals %v, want 12 and 6", z.Totals)
		}
		if f := z.Fleet; f != nil && f.Error == "" && f.Totals["allowed"] == 24 && f.Totals["denied"] == 12 && len(f.Nodes) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet view %+v, want 24 allowed and 12 denied by 2 nodes", z.Fleet)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The counters live under the key prefix, with a TTL.
	keys := r.MustDo("KEYS", "rl:fleet:*")
	if !strings.Contains(keys, "rl:fleet:{obs_fleet}:nodes") {
		t.Errorf("fleet keys %q", keys)
	}
	for _, k := range strings.Split(keys, "\n") {
		if ttl, _ := strconv.Atoi(r.MustDo("TTL", k)); ttl <= 0 || ttl > int(observe.FleetRetention/time.Second) {
			t.Errorf("%s has TTL %d", k, ttl)
		}
	}
}

// TestDashboardHandlerOnASite: rate_limit_dashboard serves the same page
// and statistics on a site route, where any browser can open them.
func TestDashboardHandlerOnASite(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit /api/* {
		zone obs_site {
			rate 1 1h
		}
	}
	handle /rate-limits/* {
		rate_limit_dashboard
	}
	respond "ok"`)
	n.get("/api/x")
	n.get("/api/x")
	// Without the trailing slash the page's relative links would not
	// resolve: redirected.
	wantRedirect(t, n, "/rate-limits/x?series=10", "/rate-limits/x/?series=10")
	page := n.get("/rate-limits/", "Sec-Fetch-Mode: navigate")
	if page.Status != 200 || !strings.Contains(page.Body, `<script src="dashboard.js"`) || page.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("page: %d %.200q", page.Status, page.Body)
	}
	if js := n.get("/rate-limits/dashboard.js"); js.Status != 200 || js.Header.Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Errorf("script: %d %q", js.Status, js.Header.Get("Content-Type"))
	}
	var s stats
	r := n.get("/rate-limits/stats")
	if err := json.Unmarshal([]byte(r.Body), &s); err != nil || zoneIndex(s, "obs_site") < 0 {
		t.Fatalf("stats: %v %.300q", err, r.Body)
	}
	if z := s.Zones[zoneIndex(s, "obs_site")]; z.Totals["allowed"] != 1 || z.Totals["denied"] != 1 {
		t.Errorf("stats through the site: %v", z.Totals)
	}
	if r := n.do(http.MethodPost, "/rate-limits/stats"); r.Status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", r.Status)
	}

	// Mounted at the site's root, a path that starts with "//" is
	// redirected on this site, not to the host it names.
	n.reload("", `rate_limit_dashboard`)
	wantRedirect(t, n, "//evil.example", "//evil.example/")
	wantRedirect(t, n, "//evil.example?a=b", "//evil.example/?a=b")
	wantRedirect(t, n, "/%5Cevil.example", "/%5Cevil.example/")
}

// wantRedirect checks that the node redirects path to want (path and
// query), on the same site.
func wantRedirect(t *testing.T, n *node, path, want string) {
	t.Helper()
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodGet, n.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	ref, err := url.Parse(loc)
	if resp.StatusCode != http.StatusPermanentRedirect || err != nil {
		t.Fatalf("%s: %d, Location %q (%v)", path, resp.StatusCode, loc, err)
	}
	if strings.HasPrefix(loc, "//") || strings.ContainsRune(loc, '\\') {
		t.Errorf("%s: Location %q", path, loc)
	}
	got := req.URL.ResolveReference(ref)
	if got.Host != req.URL.Host || got.RequestURI() != want {
		t.Errorf("%s: Location %q goes to %s, want %s on this site", path, loc, got, want)
	}
}

// TestObservabilityAfterFailedReload: a configuration that fails to load
// after its rate_limit handler provisioned (a later handler's Provision
// fails) never runs; Caddy keeps the old one, and the stats describe the
// old one, not the failed one.
func TestObservabilityAfterFailedReload(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone obs_failed_reload {
			rate 10 1h
		}
	}
	respond "a"`)
	n.get("/")
	// The header handler compiles its regular expression at Provision,
	// after the rate_limit handler before it in the route provisioned.
	if err := n.Reload("", `
	route {
		rate_limit {
			zone obs_failed_reload {
				rate 20 1h
			}
		}
		header X-Bad "re(" "x"
		respond "b"
	}`); err == nil {
		t.Fatal("a configuration with an invalid regular expression loaded")
	}
	if r := n.get("/"); r.Status != 200 || r.Body != "a" {
		t.Fatalf("after the failed reload: %d %q, want the old configuration", r.Status, r.Body)
	}
	s := n.stats("?series=0")
	i := zoneIndex(s, "obs_failed_reload")
	if i < 0 {
		t.Fatalf("no obs_failed_reload in the stats: %+v", s)
	}
	if z := s.Zones[i]; z.Rate != 10 || z.Store != "memory" || z.Totals["allowed"] != 2 {
		t.Errorf("stats after the failed reload: rate %d store %q totals %v, want the running configuration's rate 10", z.Rate, z.Store, z.Totals)
	}
}
