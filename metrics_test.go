package fleetlimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Zone names are process-wide in the stats registry: every test here uses
// its own.

// obsHandler provisions a rate_limit handler from its JSON in a config
// context of its own (with its own metrics registry); cancel cleans it up,
// as unloading the config does.
func obsHandler(t testing.TB, raw string) (*Handler, caddy.Context, context.CancelFunc) {
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
	return mod.(*Handler), ctx, stop
}

var nextOK = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// serve sends one request with header X-Key: key through h and returns the
// status and the request's replacer.
func serve(t testing.TB, h *Handler, key string) (int, *caddy.Replacer) {
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

func zoneConfig(zone string, extra string) string {
	return fmt.Sprintf(`{"zones":[{"name":%q,"key":["{http.request.header.X-Key}"],"rate":3,"per":3600000000000}]%s}`, zone, extra)
}

// gather returns the value of one series of a registry (and whether it is
// there): name, then label pairs.
func gather(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
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
	if len(z.TopDenied.Keys) != 1 || z.TopDenied.Keys[0].Key != limiter.KeyDigest("a") || z.TopDenied.Keys[0].Denied != 2 || !z.TopDenied.Hashed {
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
	if n, _ := zoneRegistry.References(zone); n != 0 {
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

func TestZoneOutcome(t *testing.T) {
	t.Parallel()
	rule := func(p limiter.Policy) *limiter.Rule {
		r, err := limiter.NewRule("z", 1, time.Second, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.SetFailurePolicy(p, 1); err != nil {
			t.Fatal(err)
		}
		return r
	}
	allow, deny, local := rule(limiter.PolicyAllow), rule(limiter.PolicyDeny), rule(limiter.PolicyLocal)
	yes, no := &limiter.Result{Allowed: true}, &limiter.Result{}
	unknown := &limiter.Result{Allowed: true, Unknown: true}
	for _, c := range []struct {
		outcome limiter.Outcome
		rule    *limiter.Rule
		res     *limiter.Result
		want    limiter.Outcome
		ok      bool
	}{
		{limiter.Admitted, allow, yes, limiter.Admitted, true},
		{limiter.Denied, allow, no, limiter.Denied, true},
		{limiter.Denied, allow, yes, 0, false},     // another zone denied
		{limiter.Denied, allow, unknown, 0, false}, // a cached denial elsewhere
		{limiter.FailedOpen, allow, unknown, limiter.FailedOpen, true},
		{limiter.FailedClosed, deny, &limiter.Result{Unknown: true}, limiter.FailedClosed, true},
		{limiter.FailedClosed, allow, unknown, 0, false},
		{limiter.LocalAdmitted, local, yes, limiter.LocalAdmitted, true},
		{limiter.LocalAdmitted, allow, unknown, limiter.FailedOpen, true},
		{limiter.LocalDenied, local, no, limiter.LocalDenied, true},
		{limiter.LocalDenied, local, yes, 0, false},
		{limiter.LocalDenied, allow, unknown, 0, false},
	} {
		got, ok := zoneOutcome(c.outcome, c.rule, c.res)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("zoneOutcome(%v, %v, %+v) = %v, %v; want %v, %v", c.outcome, c.rule.OnError, *c.res, got, ok, c.want, c.ok)
		}
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

func TestStoreNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		redis *RedisConfig
		want  string
	}{
		{nil, "memory"},
		{&RedisConfig{Address: "10.0.0.1:6379", Password: "secret"}, "redis:10.0.0.1:6379"},
		{&RedisConfig{Address: "10.0.0.1:6379", DB: 2}, "redis:10.0.0.1:6379/2"},
		{&RedisConfig{Addresses: []string{"a:1", "b:2"}}, "cluster:a:1,b:2"},
		{&RedisConfig{Address: "a:1", Cluster: true}, "cluster:a:1"},
		{&RedisConfig{SentinelMaster: "mymaster", SentinelAddresses: []string{"s:26379"}}, "sentinel:mymaster"},
	} {
		h := &Handler{Redis: c.redis}
		if got := h.storeName(); got != c.want || strings.Contains(got, "secret") {
			t.Errorf("storeName(%+v) = %q, want %q", c.redis, got, c.want)
		}
	}
}

// BenchmarkObservability is the handler's cost with its metrics, stats and
// placeholders, against the same handler with disable_metrics (which keeps
// only the placeholders): an admitted and a denied request on the memory
// store, each with a fresh replacer as Caddy gives every request.
func BenchmarkObservability(b *testing.B) {
	for _, m := range []struct{ name, extra string }{{"metrics", ""}, {"disable_metrics", `,"disable_metrics":true`}} {
		for _, denied := range []bool{false, true} {
			name := m.name + "/admitted"
			rate := "1000000000"
			if denied {
				name, rate = m.name+"/denied", "1"
			}
			b.Run(name, func(b *testing.B) {
				zone := fmt.Sprintf("bench_%s_%v", m.name, denied)
				h, _, _ := obsHandler(b, fmt.Sprintf(`{"headers":"none","zones":[{"name":%q,"key":["{http.request.header.X-Key}"],"rate":%s,"per":3600000000000}]%s}`, zone, rate, m.extra))
				h.logger = zap.NewNop() // Caddy logs at info level: a denial costs a level check
				r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api", nil)
				r.Header.Set("X-Key", "hot")
				r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, nil)
				w := httptest.NewRecorder()
				if denied {
					_ = h.ServeHTTP(w, r, nextOK)
				}
				b.ReportAllocs()
				for b.Loop() {
					repl := caddy.NewReplacer()
					r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
					_ = h.ServeHTTP(w, r, nextOK)
				}
			})
		}
	}
}

// TestSeriesUsers: a store's series stay while any stats value uses them
// (a twin store of the same name, or the successor of a reload), and go
// with the last.
func TestSeriesUsers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := registerMetrics(reg); err != nil {
		t.Fatalf("registering twice: %v", err)
	}
	const name = "redis:unit-twins:6379"
	a := claimStoreSeries(name)
	b := claimStoreSeries(name)
	a.errors[reasonTimeout].Inc()
	b.errors[reasonTimeout].Inc()
	releaseStoreSeries(name)
	if got, _ := gather(t, reg, "caddy_rate_limit_store_errors_total", "store", name, "reason", "timeout"); got != 2 {
		t.Fatalf("after one of two users left: %v, want 2", got)
	}
	releaseStoreSeries(name)
	if _, ok := gather(t, reg, "caddy_rate_limit_store_errors_total", "store", name); ok {
		t.Fatal("the series outlived their last user")
	}
}
