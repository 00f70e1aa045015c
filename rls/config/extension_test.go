package config

import (
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

func TestExtensions(t *testing.T) {
	cfg := load(t, "extensions.yaml")
	for _, c := range []struct {
		key   string
		alg   limiter.Algorithm
		burst int64
		zone  string
	}{
		{"api_key", limiter.TokenBucket, 40, ""},
		{"upload", limiter.LeakyBucket, 0, ""},
		{"search", limiter.SlidingWindow, 0, ""},
		{"login", limiter.SlidingLog, 0, ""},
		{"plain", limiter.FixedWindow, 0, ""},
		{"remote_address", limiter.FixedWindow, 0, "per_ip"},
	} {
		l := cfg.Match("ext", ents(c.key, "v"))
		if l == nil || l.Algorithm != c.alg || l.Burst != c.burst || l.Zone != c.zone {
			t.Errorf("%s: %+v, want %v burst %d zone %q", c.key, l, c.alg, c.burst, c.zone)
		}
	}
	l := cfg.Match("ext", ents("remote_address", "192.0.2.1"))
	if l.Unit != UnitUnknown || l.RequestsPerUnit != 0 || l.Name != "shared_with_caddy" {
		t.Errorf("zone rule: %+v, want no rate of its own and its name", l)
	}
	// Without algorithm, a rule counts as the reference does.
	if l := load(t, "nested.yaml").Match("storefront", ents("client_id", "c")); l.Algorithm != limiter.FixedWindow || l.Burst != 0 || l.Zone != "" {
		t.Errorf("reference rule: %+v", l)
	}
}

func TestRefuseExtensions(t *testing.T) {
	rl := func(lines string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n" + lines
	}
	runRefusals(t, []refuseCase{
		{"unknown algorithm", rl("      unit: second\n      requests_per_unit: 5\n      algorithm: gcra\n"), "f.yaml:7", `unknown algorithm "gcra"`},
		{"empty algorithm", rl("      unit: second\n      algorithm: ''\n"), "f.yaml:6", "algorithm is empty"},
		{"concurrency", rl("      unit: second\n      requests_per_unit: 5\n      algorithm: concurrency\n"), "f.yaml:7", "never reports"},
		{"quota is not an algorithm here", rl("      unit: day\n      requests_per_unit: 5\n      algorithm: quota\n"), "f.yaml:7", "unknown algorithm"},
		{"burst without algorithm", rl("      unit: second\n      requests_per_unit: 5\n      burst: 9\n"), "f.yaml:7", "burst applies to token_bucket and leaky_bucket only"},
		{"burst with a window", rl("      unit: second\n      requests_per_unit: 5\n      algorithm: fixed_window\n      burst: 9\n"), "f.yaml:8", "burst applies to token_bucket and leaky_bucket only"},
		{"burst with sliding log", rl("      unit: second\n      requests_per_unit: 5\n      burst: 9\n      algorithm: sliding_log\n"), "f.yaml:7", "burst applies to"},
		{"zero burst", rl("      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n      burst: 0\n"), "f.yaml:8", "burst must be a positive integer"},
		{"negative burst", rl("      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n      burst: -3\n"), "f.yaml:8", "burst must be a positive integer"},
		{"fractional burst", rl("      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n      burst: 1.5\n"), "f.yaml:8", "whole number"},
		{"zero rate with an algorithm", rl("      unit: second\n      requests_per_unit: 0\n      algorithm: token_bucket\n"), "f.yaml:7", "rate must be a positive integer"},
		{"window too long", rl("      unit: month\n      requests_per_unit: 5\n      algorithm: sliding_window\n"), "f.yaml:7", "under 24 days"},
		{"window limit too high", rl("      unit: second\n      requests_per_unit: 4000000000\n      algorithm: sliding_window\n"), "f.yaml:7", "at most 2097151"},
		{"unlimited with algorithm", rl("      unlimited: true\n      algorithm: token_bucket\n"), "f.yaml:6", "remove algorithm"},
		{"unlimited with burst", rl("      unlimited: true\n      burst: 3\n"), "f.yaml:6", "remove burst"},
		{"empty zone", rl("      zone: ''\n"), "f.yaml:5", "zone is empty"},
		{"zone with unit", rl("      zone: z\n      unit: second\n"), "f.yaml:5", "remove unit"},
		{"zone with requests", rl("      requests_per_unit: 3\n      zone: z\n"), "f.yaml:6", "remove requests_per_unit"},
		{"zone with algorithm", rl("      zone: z\n      algorithm: token_bucket\n"), "f.yaml:5", "remove algorithm"},
		{"zone with burst", rl("      zone: z\n      burst: 2\n"), "f.yaml:5", "remove burst"},
		{"zone with unlimited", rl("      zone: z\n      unlimited: true\n"), "f.yaml:5", "remove unlimited"},
		{"zone as a list", rl("      zone: [a]\n"), "f.yaml:5", "zone must be a string"},
		{"algorithm outside rate_limit", "domain: d\ndescriptors:\n  - key: k\n    algorithm: token_bucket\n", "f.yaml:4", "algorithm belongs inside rate_limit, not in a descriptor"},
		{"zone at the top", "domain: d\nzone: z\n", "f.yaml:2", "zone belongs inside rate_limit"},
		{"burst in replaces", rl("      unit: second\n      replaces:\n        - name: a\n          burst: 2\n"), "f.yaml:8", "burst belongs inside rate_limit"},
	})
}
