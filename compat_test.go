package fleetlimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	// The matchers of the zones' match sets.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// testHandler provisions a handler from its JSON with a logger that
// records every line, and cleans it up when the test ends.
func testHandler(t *testing.T, raw string, prepare ...func(*Handler)) (*Handler, *observer.ObservedLogs) {
	t.Helper()
	h, logs, err := provisionJSON(t, raw, prepare...)
	if err != nil {
		t.Fatalf("provisioning %s: %v", raw, err)
	}
	return h, logs
}

// provisionJSON provisions a handler from its JSON, as Caddy loads it,
// with a logger that records every line; prepare may set what tests set
// (the clock) before provisioning.
func provisionJSON(t *testing.T, raw string, prepare ...func(*Handler)) (*Handler, *observer.ObservedLogs, error) {
	t.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(raw), h); err != nil {
		t.Fatalf("unmarshalling %s: %v", raw, err)
	}
	for _, p := range prepare {
		p(h)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		return nil, logs, err
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	return h, logs, nil
}

// pluginJSON is mholt/caddy-ratelimit's JSON handler config, with its
// durations in both forms (a string and nanoseconds).
const pluginJSON = `{
	"rate_limits": {
		"zeta": {
			"match": [{"method": ["GET"]}],
			"key": "{http.request.header.X-Key}",
			"window": "5s",
			"max_events": 2,
			"ipv4_prefix": 24,
			"ipv6_prefix": 64
		},
		"alpha": {"window": 60000000000, "max_events": 100},
		"mid.dle-1": {"key": "static", "window": "1h", "max_events": 7}
	},
	"distributed": {"write_interval": "5s", "read_interval": 5000000000, "purge_age": "1m"},
	"storage": {"module": "file_system", "root": "/var/lib/caddy"},
	"jitter": 0.2,
	"sweep_interval": "1m",
	"log_key": true
}`

// TestRateLimitsJSON: caddy-ratelimit's rate_limits become zones sorted
// by name, each at most max_events in any window (a sliding log), with its
// matchers, key and prefixes; no key is one shared bucket.
func TestRateLimitsJSON(t *testing.T) {
	t.Parallel()
	h, logs := testHandler(t, pluginJSON)
	want := []struct {
		name     string
		window   time.Duration
		events   int64
		key      []string
		v4, v6   int
		matchers int
	}{
		{"alpha", time.Minute, 100, nil, 0, 0, 0},
		{"mid.dle-1", time.Hour, 7, []string{"static"}, 0, 0, 0},
		{"zeta", 5 * time.Second, 2, []string{"{http.request.header.X-Key}"}, 24, 64, 1},
	}
	if len(h.Zones) != len(want) {
		t.Fatalf("%d zones, want %d", len(h.Zones), len(want))
	}
	for i, w := range want {
		z := h.Zones[i]
		if z.Name != w.name || time.Duration(z.Window) != w.window || z.Events != w.events ||
			strings.Join(z.Key, " ") != strings.Join(w.key, " ") || z.IPv4Prefix != w.v4 || z.IPv6Prefix != w.v6 ||
			len(z.matchers) != w.matchers {
			t.Errorf("zone %d: %s window %v events %d key %q prefixes %d/%d matchers %d, want %+v",
				i, z.Name, time.Duration(z.Window), z.Events, z.Key, z.IPv4Prefix, z.IPv6Prefix, len(z.matchers), w)
		}
		if z.rule.Algorithm() != limiter.SlidingLog || z.rule.Rate() != w.events {
			t.Errorf("zone %s: algorithm %v rate %d, want sliding_log %d", z.Name, z.rule.Algorithm(), z.rule.Rate(), w.events)
		}
	}
	if n := len(h.Zones[0].keys); n != 0 {
		t.Errorf("alpha has no key, so one bucket for all: %d key expressions", n)
	}
	if time.Duration(h.SweepInterval) != time.Minute || h.jitterShare != 0.2 || !h.LogKey {
		t.Errorf("sweep_interval %v jitter %v log_key %v", time.Duration(h.SweepInterval), h.jitterShare, h.LogKey)
	}
	if time.Duration(h.Distributed.ReadInterval) != 5*time.Second || time.Duration(h.Distributed.PurgeAge) != time.Minute {
		t.Errorf("distributed: %+v", h.Distributed)
	}
	for _, phrase := range []string{"'distributed' block", "'storage'", "log_denials info"} {
		if n := logs.FilterMessageSnippet(phrase).FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
			t.Errorf("%d warnings about %s, want 1: %v", n, phrase, logs.AllUntimed())
		}
	}
}

// TestRateLimitsJSONOrderIsStable: the zones come in the same order
// however the object lists them.
func TestRateLimitsJSONOrderIsStable(t *testing.T) {
	t.Parallel()
	a, _ := testHandler(t, `{"rate_limits":{"b":{"window":"1s","max_events":1},"a":{"window":"1s","max_events":1},"c":{"window":"1s","max_events":1}}}`)
	b, _ := testHandler(t, `{"rate_limits":{"c":{"window":"1s","max_events":1},"b":{"window":"1s","max_events":1},"a":{"window":"1s","max_events":1}}}`)
	if a.policy != b.policy || !strings.HasPrefix(a.policy, `"a";`) {
		t.Errorf("policies differ or are not sorted: %s | %s", a.policy, b.policy)
	}
}

// request is a request as Caddy's server hands it to handlers, from the
// client IP ip with optional header lines.
func request(method, ip string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, "http://127.0.0.1/", nil)
	r.RemoteAddr = ip + ":40000"
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		r.Header.Set(k, strings.TrimSpace(v))
	}
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, nil)
	caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, ip)
	return r
}

// serve runs a request through the handler and returns its status.
func serve(t *testing.T, h *Handler, r *http.Request) (int, http.Header) {
	t.Helper()
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	if err != nil {
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) {
			t.Fatalf("ServeHTTP: %v", err)
		}
		return he.StatusCode, w.Header()
	}
	return http.StatusOK, w.Header()
}

// TestLegacyZoneWithoutKeySharesOneBucket: a zone in caddy-ratelimit's
// form without a key (JSON rate_limits, or window and events in zones as
// the Caddyfile writes them) is one bucket for every client, as in that
// plugin; a zone in fleetlimit's form without a key is one per client IP.
func TestLegacyZoneWithoutKeySharesOneBucket(t *testing.T) {
	t.Parallel()
	shared := map[string]string{
		"rate_limits": `{"rate_limits":{"shared1":{"window":"1m","max_events":2}}}`,
		"window form": `{"zones":[{"name":"shared2","window":60000000000,"events":2}]}`,
	}
	for name, raw := range shared {
		h, _ := testHandler(t, raw)
		got := []int{}
		for _, r := range []*http.Request{
			request("GET", "192.0.2.1"), request("GET", "198.51.100.2", "X-Key: b"), request("POST", "2001:db8::3"),
		} {
			status, _ := serve(t, h, r)
			got = append(got, status)
		}
		if got[0] != 200 || got[1] != 200 || got[2] != 429 {
			t.Errorf("%s: three clients got %v, want 200 200 429 (one shared bucket of 2)", name, got)
		}
	}
	h, _ := testHandler(t, `{"zones":[{"name":"perip","rate":2,"per":60000000000}]}`)
	for _, ip := range []string{"192.0.2.1", "198.51.100.2"} {
		for i := range 3 {
			want := 200
			if i == 2 {
				want = 429
			}
			if status, _ := serve(t, h, request("GET", ip)); status != want {
				t.Errorf("rate form, %s request %d: %d, want %d (a bucket of 2 per client IP)", ip, i+1, status, want)
			}
		}
	}
}

// TestJitterReading: a share from 0 to 1, a whole percentage from 2 to
// 100, and nothing in between, so that no value sits on a cliff.
func TestJitterReading(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   float64
		want float64
		ok   bool
	}{
		{0, 0, true}, {0.2, 0.2, true}, {0.999, 0.999, true}, {1, 1, true},
		{2, 0.02, true}, {20, 0.2, true}, {100, 1, true},
		{1.01, 0, false}, {1.5, 0, false}, {2.5, 0, false}, {20.5, 0, false}, {101, 0, false}, {-0.1, 0, false},
	} {
		got, err := jitterShare(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("jitterShare(%v) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"0.2", 0.2, true}, {"20", 20, true}, {"20%", 0.2, true}, {"1.5%", 0.015, true}, {"100%", 1, true}, {"0%", 0, true},
		{"1.01", 0, false}, {"150%", 0, false}, {"-1%", 0, false}, {"x%", 0, false}, {"NaN", 0, false}, {"lots", 0, false},
	} {
		got, err := parseJitter(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseJitter(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
}

// TestJitterWarning: a configuration in caddy-ratelimit's form with jitter
// above 1 gets one warning at start saying what it means now; fleetlimit's
// form, and a share, get none.
func TestJitterWarning(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw  string
		want int
	}{
		{`{"jitter":20,"rate_limits":{"z":{"window":"1m","max_events":2}}}`, 1},
		{`{"jitter":20,"log_denials":"debug","zones":[{"name":"z","window":60000000000,"events":2},{"name":"y","window":1000000000,"events":2}]}`, 1},
		{`{"jitter":0.2,"rate_limits":{"z":{"window":"1m","max_events":2}}}`, 0},
		{`{"jitter":20,"zones":[{"name":"z","rate":2,"per":60000000000}]}`, 0},
	} {
		_, logs := testHandler(t, c.raw)
		warnings := logs.FilterMessageSnippet("caddy-ratelimit read it as up to 20 times the wait").FilterLevelExact(zapcore.WarnLevel)
		if warnings.Len() != c.want {
			t.Errorf("%s: %d jitter warnings, want %d: %v", c.raw, warnings.Len(), c.want, logs.AllUntimed())
		}
		if c.want == 1 && !strings.Contains(warnings.All()[0].Message, "jitter 20 adds up to 20% of the wait") {
			t.Errorf("the warning does not say what jitter 20 means now: %s", warnings.All()[0].Message)
		}
	}
}
