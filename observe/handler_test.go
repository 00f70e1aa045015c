package observe_test

// Tests that drive the rate_limit handler, as Caddy runs it, and read what
// it reports. They import package fleetlimit, which imports this package, so
// they live in package observe_test and reach the internals they read
// through the names export_test exports.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// The internals read here.
var (
	collectStats = observe.CollectStats
	gather       = observe.Gather
	adminGet     = observe.AdminGet
	zoneRefs     = observe.ZoneReferences
)

type (
	statsBody = observe.StatsBody
	statsZone = observe.StatsZone
)

const seriesSeconds = observe.SeriesSeconds

// Zone names are process-wide in the stats registry: every test here uses
// its own.

// obsHandler provisions a rate_limit handler from its JSON in a config
// context of its own (with its own metrics registry); cancel cleans it up,
// as unloading the config does.
func obsHandler(t testing.TB, raw string) (*fleetlimit.Handler, caddy.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	mod, err := ctx.LoadModuleByID("http.handlers.rate_limit", json.RawMessage(raw))
	if err != nil {
		cancel()
		t.Fatalf("loading the handler: %v", err)
	}
	var once sync.Once
	stop := func() { once.Do(cancel) }
	t.Cleanup(stop)
	return mod.(*fleetlimit.Handler), ctx, stop
}

var nextOK = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// serve sends one request with header X-Key: key through h and returns the
// status and the request's replacer.
func serve(t testing.TB, h *fleetlimit.Handler, key string) (int, *caddy.Replacer) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api", nil)
	r.RemoteAddr = "192.0.2.7:41234"
	r.Header.Set("X-Key", key)
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, nil, nil)
	caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "192.0.2.7")
	err := h.ServeHTTP(httptest.NewRecorder(), r, nextOK)
	if err == nil {
		return http.StatusOK, repl
	}
	var he caddyhttp.HandlerError
	if ok := asHandlerError(err, &he); ok {
		return he.StatusCode, repl
	}
	t.Fatalf("ServeHTTP: %v", err)
	return 0, repl
}

func asHandlerError(err error, he *caddyhttp.HandlerError) bool {
	e, ok := err.(caddyhttp.HandlerError)
	if ok {
		*he = e
	}
	return ok
}

// digestSecret is the key_digest_secret of zoneConfig.
const digestSecret = "unit-digest-secret"

func zoneConfig(zone string, extra string) string {
	return fmt.Sprintf(`{"key_digest_secret":%q,"zones":[{"name":%q,"key":["{http.request.header.X-Key}"],"rate":3,"per":3600000000000}]%s}`, digestSecret, zone, extra)
}

func findZone(t *testing.T, stats *statsBody, name string) *statsZone {
	t.Helper()
	for i := range stats.Zones {
		if stats.Zones[i].Name == name {
			return &stats.Zones[i]
		}
	}
	return nil
}

func TestMetricsPlaceholdersAndStats(t *testing.T) {
	t.Parallel()
	const zone = "unit_counts"
	h, ctx, _ := obsHandler(t, zoneConfig(zone, ""))
	want := map[string][]int{"a": {200, 200, 200, 429, 429}, "b": {200}}
	for _, key := range []string{"a", "b"} {
		for i, w := range want[key] {
			status, repl := serve(t, h, key)
			if status != w {
				t.Fatalf("key %s request %d: status %d, want %d", key, i, status, w)
			}
			rem, _ := repl.Get("http.rate_limit." + zone + ".remaining")
			lim, _ := repl.GetString("http.rate_limit." + zone + ".limit")
			wantRem := int64(max(0, 2-i))
			if rem != wantRem || lim != "3" {
				t.Errorf("key %s request %d: placeholders remaining %v limit %q, want %d and 3", key, i, rem, lim, wantRem)
			}
		}
	}
	reg := ctx.GetMetricsRegistry()
	for outcome, n := range map[string]float64{"allowed": 4, "denied": 2, "failed_open": 0} {
		got, ok := gather(t, reg, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", outcome)
		if !ok || got != n {
			t.Errorf("decisions_total{outcome=%q}: %v (present %v), want %v", outcome, got, ok, n)
		}
	}

	// The stats, as if a second later, so that this second is a whole one.
	now := time.Now().Add(time.Second)
	stats := collectStats(context.Background(), now, 60)
	z := findZone(t, stats, zone)
	if z == nil {
		t.Fatalf("zone %s missing from the stats", zone)
	}
	if z.Totals.Allowed != 4 || z.Totals.Denied != 2 {
		t.Errorf("totals %+v, want 4 allowed and 2 denied", z.Totals)
	}
	if z.Rate != 3 || z.Per != "1h0m0s" || z.Store != "memory" || z.Algorithm != "token_bucket" {
		t.Errorf("zone description %+v", z)
	}
	var allowed, denied uint64
	for i := range z.Series.Allowed {
		allowed += z.Series.Allowed[i]
		denied += z.Series.Denied[i]
	}
	if allowed != 4 || denied != 2 || len(z.Series.Allowed) != 60 || z.Series.End != now.Unix()-1 {
		t.Errorf("series: %d allowed, %d denied over %d seconds ending %d", allowed, denied, len(z.Series.Allowed), z.Series.End)
	}
	if got := z.Rates.Sixty.Allowed * 60; got != 4 {
		t.Errorf("60 s rate of allowed × 60 = %v, want 4", got)
	}
	if len(z.TopDenied.Keys) != 1 || z.TopDenied.Keys[0].Key != limiter.NewDigester([]byte(digestSecret)).Digest("a") || z.TopDenied.Keys[0].Denied != 2 || !z.TopDenied.Hashed {
		t.Errorf("top denied %+v, want a's digest denied twice", z.TopDenied)
	}
	if z.Fleet != nil {
		t.Errorf("a memory store has no fleet view: %+v", z.Fleet)
	}
}

func TestLogKeyShowsKeys(t *testing.T) {
	t.Parallel()
	const zone = "unit_logkey"
	h, _, _ := obsHandler(t, zoneConfig(zone, `,"log_key":true`))
	for range 5 {
		serve(t, h, "sk_live_x")
	}
	z := findZone(t, collectStats(context.Background(), time.Now(), 0), zone)
	if z == nil || len(z.TopDenied.Keys) != 1 || z.TopDenied.Keys[0].Key != "sk_live_x" || z.TopDenied.Hashed {
		t.Fatalf("with log_key the table shows the key: %+v", z)
	}
	if z.Series != nil {
		t.Errorf("series=0 still sent a series")
	}
}

// TestMetricsSurviveReload: a new config (a new registry) provisions before
// the old one is cleaned up; the zone's counters go on counting in the new
// registry, and disappear with the last handler that has the zone.
func TestMetricsSurviveReload(t *testing.T) {
	t.Parallel()
	const zone = "unit_reload"
	h1, _, stop1 := obsHandler(t, zoneConfig(zone, ""))
	serve(t, h1, "k")
	serve(t, h1, "k")
	h2, ctx2, stop2 := obsHandler(t, zoneConfig(zone, ""))
	if n := zoneRefs(zone); n != 2 {
		t.Errorf("zone registry holds %d references of the two handlers", n)
	}
	stop1()
	serve(t, h2, "k")
	serve(t, h2, "k")
	reg := ctx2.GetMetricsRegistry()
	if got, _ := gather(t, reg, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "allowed"); got != 3 {
		t.Errorf("allowed after the reload: %v, want 3 (2 before, 1 after)", got)
	}
	if got, _ := gather(t, reg, "caddy_rate_limit_decisions_total", "zone", zone, "outcome", "denied"); got != 1 {
		t.Errorf("denied after the reload: %v, want 1", got)
	}
	z := findZone(t, collectStats(context.Background(), time.Now(), 0), zone)
	if z == nil || z.Totals.Allowed != 3 || z.Totals.Denied != 1 {
		t.Fatalf("stats after the reload: %+v", z)
	}
	stop2()
	if findZone(t, collectStats(context.Background(), time.Now(), 0), zone) != nil {
		t.Error("the zone's stats outlived its last handler")
	}
	if _, ok := gather(t, reg, "caddy_rate_limit_decisions_total", "zone", zone); ok {
		t.Error("the zone's series outlived its last handler")
	}
	if n := zoneRefs(zone); n != 0 {
		t.Errorf("zone registry holds %d references", n)
	}
}

func TestDisableMetrics(t *testing.T) {
	t.Parallel()
	const zone = "unit_disabled"
	h, ctx, _ := obsHandler(t, zoneConfig(zone, `,"disable_metrics":true`))
	_, repl := serve(t, h, "k")
	if v, _ := repl.GetString("http.rate_limit." + zone + ".limit"); v != "3" {
		t.Errorf("placeholders stay with metrics disabled: limit %q", v)
	}
	if _, ok := gather(t, ctx.GetMetricsRegistry(), "caddy_rate_limit_decisions_total", "zone", zone); ok {
		t.Error("a series for a zone with metrics disabled")
	}
	if findZone(t, collectStats(context.Background(), time.Now(), 0), zone) != nil {
		t.Error("stats for a zone with metrics disabled")
	}
}

// TestConcurrentObservation runs requests and stats readers at once (for
// the race detector) and checks that no count is lost.
func TestConcurrentObservation(t *testing.T) {
	t.Parallel()
	const zone = "unit_concurrent"
	h, _, _ := obsHandler(t, zoneConfig(zone, ""))
	const workers, each = 8, 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				collectStats(context.Background(), time.Now(), seriesSeconds)
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				serve(t, h, fmt.Sprintf("k%d-%d", w, i%40))
			}
		}()
	}
	wg.Wait()
	close(stop)
	z := findZone(t, collectStats(context.Background(), time.Now(), 0), zone)
	if got := z.Totals.Allowed + z.Totals.Denied; got != workers*each {
		t.Fatalf("counted %d decisions, want %d", got, workers*each)
	}
	// Each of the 320 keys has 3 tokens and 5 requests.
	if z.Totals.Allowed != 320*3 {
		t.Errorf("allowed %d, want %d", z.Totals.Allowed, 320*3)
	}
}

func TestAdminStatsJSON(t *testing.T) {
	t.Parallel()
	const zone = "unit_admin"
	h, _, _ := obsHandler(t, zoneConfig(zone, ""))
	for range 4 {
		serve(t, h, "x")
	}
	w, err := adminGet(t, http.MethodGet, "/rate_limit/stats?series=10")
	if err != nil {
		t.Fatal(err)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var body map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("%v: %s", err, w.Body.String())
	}
	var z map[string]any
	for _, v := range body["zones"].([]any) {
		if m := v.(map[string]any); m["name"] == zone {
			z = m
		}
	}
	if z == nil {
		t.Fatalf("zone %s missing: %s", zone, w.Body.String())
	}
	totals := z["totals"].(map[string]any)
	if totals["allowed"] != 3.0 || totals["denied"] != 1.0 {
		t.Errorf("totals %v", totals)
	}
	for _, window := range []string{"1s", "10s", "60s"} {
		if _, ok := z["rates"].(map[string]any)[window].(map[string]any)["denied"]; !ok {
			t.Errorf("rates lack the %s window: %v", window, z["rates"])
		}
	}
	if n := len(z["series"].(map[string]any)["allowed"].([]any)); n != 10 {
		t.Errorf("series of %d seconds, want 10", n)
	}
	var memory bool
	for _, s := range body["stores"].([]any) {
		m := s.(map[string]any)
		memory = memory || (m["name"] == "memory" && m["status"] == "ok")
	}
	if !memory {
		t.Errorf("stores %v lack the memory store", body["stores"])
	}
}
