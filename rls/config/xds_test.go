package config

import (
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// sameAsXDS is a configuration that RateLimitConfig resources can carry in
// full, written in YAML.
const sameAsXDS = `
domain: mesh
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: header_match
    value: premium
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 100, name: premium, replaces: [{name: basic}]}
  - key: source_cluster
    value: front
    descriptors:
      - key: destination_cluster
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 7, name: basic}
      - key: destination_cluster
        value: "cart*"
        rate_limit: {unit: day, requests_per_unit: 3}
  - key: health
    rate_limit: {unlimited: true}
`

// sameAsXDSResources is sameAsXDS as resources.
func sameAsXDSResources() []*rlsconf.RateLimitConfig {
	return []*rlsconf.RateLimitConfig{{
		Name:   "mesh-config",
		Domain: "mesh",
		Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 30}},
			{Key: "header_match", Value: "premium", ShadowMode: true, RateLimit: &rlsconf.RateLimitPolicy{
				Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 100, Name: "premium",
				Replaces: []*rlsconf.RateLimitReplace{{Name: "basic"}},
			}},
			{Key: "source_cluster", Value: "front", Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "destination_cluster", DetailedMetric: true, RateLimit: &rlsconf.RateLimitPolicy{
					Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 7, Name: "basic",
				}},
				{Key: "destination_cluster", Value: "cart*", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: 3}},
			}},
			{Key: "health", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		},
	}}
}

func TestFromXDSEqualsYAML(t *testing.T) {
	fromYAML, err := Load([]File{{Name: "mesh.yaml", Data: []byte(sameAsXDS)}})
	if err != nil {
		t.Fatal(err)
	}
	fromXDS, err := FromXDS(sameAsXDSResources())
	if err != nil {
		t.Fatal(err)
	}
	y, x := fromYAML.Limits(), fromXDS.Limits()
	if len(y) != len(x) || len(y) != 5 {
		t.Fatalf("%d rules from YAML, %d from xDS", len(y), len(x))
	}
	for i := range y {
		a, b := *y[i], *x[i]
		if !strings.HasPrefix(b.Source, `rate limit config "mesh-config": descriptors[`) {
			t.Errorf("xDS source %q", b.Source)
		}
		a.Source, b.Source, a.path, b.path = "", "", nil, nil
		if a.FullKey != b.FullKey || a.Name != b.Name || a.RequestsPerUnit != b.RequestsPerUnit || a.Unit != b.Unit ||
			a.Unlimited != b.Unlimited || strings.Join(a.Replaces, ",") != strings.Join(b.Replaces, ",") ||
			a.ShadowMode != b.ShadowMode || a.DetailedMetric != b.DetailedMetric || a.Algorithm != b.Algorithm {
			t.Errorf("rule %d: YAML %+v, xDS %+v", i, a, b)
		}
	}
	for _, es := range [][]Entry{
		ents("remote_address", "10.0.0.1"),
		ents("header_match", "premium"),
		ents("source_cluster", "front", "destination_cluster", "cart-eu"),
		ents("source_cluster", "front", "destination_cluster", "search"),
		ents("source_cluster", "back", "destination_cluster", "search"),
		ents("health", ""),
	} {
		a, b := fromYAML.Match("mesh", es), fromXDS.Match("mesh", es)
		if (a == nil) != (b == nil) || a != nil && (a.FullKey != b.FullKey || a.MetricKey(es) != b.MetricKey(es)) {
			t.Errorf("%v: YAML finds %+v, xDS %+v", es, a, b)
		}
	}
}

func TestFromXDSUnits(t *testing.T) {
	res := func(u rlsconf.RateLimitUnit) []*rlsconf.RateLimitConfig {
		return []*rlsconf.RateLimitConfig{{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: u, RequestsPerUnit: 1}},
		}}}
	}
	// A newer management server's MONTH and YEAR, by number.
	for num, want := range map[rlsconf.RateLimitUnit]Unit{1: UnitSecond, 4: UnitDay, 5: UnitMonth, 6: UnitYear, 7: UnitWeek} {
		cfg, err := FromXDS(res(num))
		if err != nil {
			t.Fatalf("unit %d: %v", num, err)
		}
		if l := cfg.Match("d", ents("k", "")); l.Unit != want {
			t.Errorf("unit %d read as %v, want %v", num, l.Unit, want)
		}
	}
	for _, u := range []rlsconf.RateLimitUnit{0, 9} {
		if _, err := FromXDS(res(u)); err == nil || !strings.HasPrefix(err.Error(), `rate limit config "d": descriptors[0].rate_limit`) {
			t.Errorf("unit %d: error %v", u, err)
		}
	}
}

func TestFromXDSRefusals(t *testing.T) {
	withLimit := func(p *rlsconf.RateLimitPolicy) []*rlsconf.RateLimitConfig {
		return []*rlsconf.RateLimitConfig{{Name: "r1", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "a", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "ok"}, {Key: "b", RateLimit: p}}},
		}}}
	}
	for _, c := range []struct {
		name string
		res  []*rlsconf.RateLimitConfig
		want string
	}{
		{"empty domain", []*rlsconf.RateLimitConfig{{Name: "r0"}}, `rate limit config "r0": the domain is empty`},
		{"no name or domain", []*rlsconf.RateLimitConfig{{}}, `rate limit config #0: the domain is empty`},
		{"duplicate domain", []*rlsconf.RateLimitConfig{{Name: "one", Domain: "d"}, {Name: "two", Domain: "d"}},
			`rate limit config "two": duplicate domain "d" (first defined at rate limit config "one")`},
		// An update lists its resources in any order: the error is the same.
		{"duplicate domain, listed the other way", []*rlsconf.RateLimitConfig{{Name: "two", Domain: "d"}, {Name: "one", Domain: "d"}},
			`rate limit config "two": duplicate domain "d" (first defined at rate limit config "one")`},
		{"empty key", []*rlsconf.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Value: "v"}}}},
			`rate limit config "r": descriptors[0]: the descriptor has an empty key`},
		{"unlimited with unit", withLimit(&rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_DAY}),
			`rate limit config "r1": descriptors[0].descriptors[1].rate_limit.unit: an unlimited rule takes no unit`},
		{"replaces self", withLimit(&rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, Name: "n",
			Replaces: []*rlsconf.RateLimitReplace{{Name: "x"}, {Name: "n"}}}),
			`rate limit config "r1": descriptors[0].descriptors[1].rate_limit.replaces[1]: a rule cannot replace itself`},
		{"replaces empty", withLimit(&rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, Replaces: []*rlsconf.RateLimitReplace{{}}}),
			`rate limit config "r1": descriptors[0].descriptors[1].rate_limit.replaces[0]: a replaces entry needs a name`},
	} {
		_, err := FromXDS(c.res)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %s", c.name, err, c.want)
		}
	}
	cfg, err := FromXDS([]*rlsconf.RateLimitConfig{nil, {Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{nil, {Key: "k"}}}})
	if err != nil || !cfg.HasDomain("d") {
		t.Errorf("nil resources and descriptors: %v", err)
	}
}
