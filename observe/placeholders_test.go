package observe

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestPlaceholders: Decided gives a request's replacer each known zone's
// remaining and limit (a tier's rule's rate for a rule from placeholders),
// none for a zone a cached denial left unconsulted, and the exceeded zone
// of a denial; zone names may hold dots; other keys are not answered.
func TestPlaceholders(t *testing.T) {
	t.Parallel()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	rule := func(name string, rate int64) *limiter.Rule {
		r, err := limiter.NewRule(limiter.RuleConfig{Name: name, Rate: rate, Per: time.Second, Burst: rate})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rules := []*limiter.Rule{rule("api.v1", 10), rule("plan", 20), rule("ip", 30)}
	h, err := New(ctx, Config{Rules: rules, DisableMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	zones := []*Zone{h.Zone(0), h.Zone(1), h.Zone(2)}
	reqs := []limiter.Request{{Rule: rules[0], Key: "k"}, {Rule: rule("plan", 500), Key: "k"}, {Rule: rules[2], Key: "k"}}
	results := []limiter.Result{{Remaining: 7}, {Remaining: 300}, {Unknown: true, Allowed: true}}
	repl := caddy.NewReplacer()
	h.Decided(nil, repl, limiter.Allowed, zones, reqs, results, "")

	want := map[string]any{
		"http.rate_limit.api.v1.remaining": int64(7),
		"http.rate_limit.api.v1.limit":     "10",
		"http.rate_limit.plan.remaining":   int64(300),
		"http.rate_limit.plan.limit":       int64(500),
	}
	for key, v := range want {
		if got, ok := repl.Get(key); !ok || got != v {
			t.Errorf("%s = %v (%T, found %v), want %v (%T)", key, got, got, ok, v, v)
		}
	}
	for _, key := range []string{"http.rate_limit.ip.remaining", "http.rate_limit.ip.limit", "http.rate_limit.exceeded.name",
		"http.rate_limit.other.remaining", "http.rate_limit.api.v1.burst", "http.request.uri"} {
		if got, ok := repl.Get(key); ok {
			t.Errorf("%s = %v, want none", key, got)
		}
	}
	denied := caddy.NewReplacer()
	h.Decided(nil, denied, limiter.Denied, zones[:1], reqs[:1], []limiter.Result{{Remaining: 0}}, "api.v1")
	if got, _ := denied.GetString("http.rate_limit.exceeded.name"); got != "api.v1" {
		t.Errorf("exceeded.name = %q, want api.v1", got)
	}
	// More zones than the provider holds inline.
	many := caddy.NewReplacer()
	h.Decided(nil, many, limiter.Allowed, []*Zone{zones[0], zones[1], zones[0], zones[1]}, []limiter.Request{reqs[0], reqs[1], reqs[0], reqs[1]},
		[]limiter.Result{{Unknown: true}, {Unknown: true}, {Remaining: 1}, {Remaining: 2}}, "")
	if got := many.ReplaceAll("{http.rate_limit.api.v1.remaining}/{http.rate_limit.plan.remaining}", "-"); got != "1/2" {
		t.Errorf("beyond the inline zones: %q, want 1/2", got)
	}
	if got := repl.ReplaceAll("{http.rate_limit.api.v1.remaining}/{http.rate_limit.plan.limit}", "-"); got != "7/500" {
		t.Errorf("replaced %q, want 7/500", got)
	}
}
