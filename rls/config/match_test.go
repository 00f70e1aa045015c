package config

import (
	"os"
	"path/filepath"
	"testing"
)

// load loads testdata files into a Config, failing the test on an error.
func load(t testing.TB, names ...string) *Config {
	t.Helper()
	var files []File
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Name: n, Data: data})
	}
	cfg, err := Load(files)
	if err != nil {
		t.Fatalf("loading %v: %v", names, err)
	}
	return cfg
}

// ents builds entries from key, value pairs.
func ents(kv ...string) []Entry {
	es := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// matchCase is a descriptor and what its match should give: the rule's
// full key ("" for none) for runMatches, its metric key for runMetricKeys.
type matchCase struct {
	name    string
	domain  string
	entries []Entry
	want    string
}

func runMatches(t *testing.T, cfg *Config, cases []matchCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := cfg.Match(c.domain, c.entries)
			switch {
			case l == nil && c.want != "":
				t.Fatalf("Match(%q, %v) = nil, want %s", c.domain, c.entries, c.want)
			case l != nil && l.FullKey != c.want:
				t.Fatalf("Match(%q, %v) = %s, want %q", c.domain, c.entries, l.FullKey, c.want)
			}
		})
	}
}

func TestMatchNested(t *testing.T) {
	cfg := load(t, "nested.yaml")
	const d = "storefront"
	runMatches(t, cfg, []matchCase{
		{"unknown domain", "nowhere", ents("client_id", "x"), ""},
		{"no entries", d, nil, ""},
		{"key without value takes the default", d, ents("client_id", "someone"), "storefront.client_id"},
		{"empty value takes the default", d, ents("client_id", ""), "storefront.client_id"},
		{"key and value win over the key", d, ents("client_id", "partner"), "storefront.client_id_partner"},
		{"a value without rate_limit has no limit", d, ents("client_id", "probe"), ""},
		{"unknown key", d, ents("colour", "red"), ""},
		{"second level by key", d, ents("tenant", "acme", "route", "/cart"), "storefront.tenant_acme.route"},
		{"second level by value", d, ents("tenant", "acme", "route", "checkout"), "storefront.tenant_acme.route_checkout"},
		{"first level alone has no limit", d, ents("tenant", "acme"), ""},
		{"first level mismatched", d, ents("tenant", "other", "route", "checkout"), ""},
		{"more entries than levels", d, ents("client_id", "a", "route", "b"), ""},
		{"limit at the last entry only", d, ents("api", "search", "country", "nz"), "storefront.api_search.country_nz"},
		{"limit at the first level", d, ents("api", "search"), "storefront.api_search"},
		{"second level unmatched", d, ents("api", "search", "country", "fr"), ""},
		{"entries beyond a leaf", d, ents("region", "eu", "zone", "a"), ""},
		// The reference finds a level by key_value as one string, so the
		// key tenant_acme alone finds tenant=acme; so does Match.
		{"composite key as the reference builds it", d, ents("tenant_acme", "", "route", "checkout"), "storefront.tenant_acme.route_checkout"},
		{"composite across key and value", d, ents("client", "id_partner"), "storefront.client_id_partner"},
		{"composite key alone", d, ents("client_id_partner", "x"), "storefront.client_id_partner"},
	})

	l := cfg.Match(d, ents("client_id", "partner"))
	if l.RequestsPerUnit != 90 || l.Unit != UnitMinute || l.Unit.Duration().Minutes() != 1 {
		t.Errorf("partner: %d per %v, want 90 per MINUTE", l.RequestsPerUnit, l.Unit)
	}
	if l.Source != "nested.yaml:26" || l.Domain != d || l.Depth() != 1 {
		t.Errorf("partner: source %q domain %q depth %d", l.Source, l.Domain, l.Depth())
	}
	units := map[string]Unit{"region": UnitHour, "plan": UnitDay, "session": UnitYear}
	for key, unit := range units {
		if l := cfg.Match(d, ents(key, "v")); l == nil || l.Unit != unit {
			t.Errorf("%s: got %+v, want unit %v", key, l, unit)
		}
	}
	if l := cfg.Match(d, ents("api", "search")); l.Unit != UnitWeek {
		t.Errorf("api_search unit %v, want WEEK", l.Unit)
	}
	if l := cfg.Match(d, ents("api", "search", "country", "nz")); l.Unit != UnitMonth || l.Unit.Seconds() != 30*86400 {
		t.Errorf("nz unit %v (%ds), want MONTH of 30 days", l.Unit, l.Unit.Seconds())
	}
	if l := cfg.Match(d, ents("plan", "pro")); l.Name != "plan_daily" {
		t.Errorf("plan name %q", l.Name)
	}
	// The same rule for every value of a key: one shared Limit.
	if cfg.Match(d, ents("client_id", "a")) != cfg.Match(d, ents("client_id", "b")) {
		t.Error("two values of a default key found different rules")
	}
}

func TestNilConfig(t *testing.T) {
	var cfg *Config
	l, err := cfg.Override("d", ents("k", "v"), 1, UnitSecond)
	if cfg.Match("d", ents("k", "v")) != nil || l != nil || err != nil || cfg.HasDomain("d") ||
		cfg.Domains() != nil || cfg.Limits() != nil || cfg.Warnings() != nil {
		t.Error("a nil Config is not empty")
	}
}

func TestMatchUnlimited(t *testing.T) {
	cfg := load(t, "nested.yaml")
	l := cfg.Match("storefront", ents("health", "ready"))
	if l == nil || !l.Unlimited || l.Unit != UnitUnknown {
		t.Fatalf("health: %+v, want unlimited without unit", l)
	}
}

func TestMatchWildcard(t *testing.T) {
	cfg := load(t, "wildcard.yaml")
	runMatches(t, cfg, []matchCase{
		{"prefix", "files", ents("path", "/static/app.js"), "files.path_/static/*"},
		{"empty rest", "files", ents("path", "/static/"), "files.path_/static/*"},
		{"first wildcard in order wins", "files", ents("path", "/static/fonts/a.woff"), "files.path_/static/*"},
		{"exact value wins over wildcard", "files", ents("path", "/static/logo.png"), "files.path_/static/logo.png"},
		{"wildcard before the key alone", "files", ents("path", "/static/x"), "files.path_/static/*"},
		{"the key alone after the wildcards", "files", ents("path", "/api/x"), "files.path"},
		{"exact value is not a prefix", "files", ents("exact", "abcd"), ""},
		{"star inside a value is literal", "files", ents("middle", "abz"), ""},
		{"literal star inside a value", "files", ents("middle", "a*z"), "files.middle_a*z"},
		{"nested wildcard", "files", ents("bucket", "eu-west", "object", "img-7"), "files.bucket_eu-west.object_img-*"},
		{"nested wildcard mismatch", "files", ents("bucket", "eu-west", "object", "doc-7"), ""},
	})
	a := cfg.Match("files", ents("path", "/static/a"))
	b := cfg.Match("files", ents("path", "/static/b"))
	if a != b || a.MetricKey(ents("path", "/static/a")) != "files.path_/static/*" {
		t.Errorf("wildcard matches differ or keep values: %p %p %q", a, b, a.MetricKey(ents("path", "/static/a")))
	}
}

func TestMatchModes(t *testing.T) {
	cfg := load(t, "modes.yaml")
	for _, c := range []struct {
		entries        []Entry
		shadow, quota  bool
		requests       uint32
		wantedFullKey  string
		wantedUnitName string
	}{
		{ents("user", "u1", "action", "list"), false, false, 4, "modes.user.action", "SECOND"},
		{ents("user", "u1", "action", "export"), true, false, 1, "modes.user.action_export", "SECOND"},
		{ents("tokens", "t"), false, true, 100, "modes.tokens", "HOUR"},
		{ents("trial", "t"), true, true, 10, "modes.trial", "DAY"},
	} {
		l := cfg.Match("modes", c.entries)
		if l == nil || l.ShadowMode != c.shadow || l.QuotaMode != c.quota || l.RequestsPerUnit != c.requests ||
			l.FullKey != c.wantedFullKey || l.Unit.String() != c.wantedUnitName {
			t.Errorf("%v: %+v", c.entries, l)
		}
	}
}

func TestOverride(t *testing.T) {
	cfg := load(t, "nested.yaml")
	l, err := cfg.Override("nowhere", ents("a", "b"), 10, UnitDay)
	if l != nil || err != nil {
		t.Fatalf("unknown domain: %+v, %v; want nil, nil as the reference", l, err)
	}
	es := ents("tenant", "acme", "route", "anything")
	l, err = cfg.Override("storefront", es, 42, UnitHour)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Override || l.RequestsPerUnit != 42 || l.Unit != UnitHour || l.FullKey != "storefront.tenant_acme.route_anything" ||
		l.ShadowMode || l.Name != "" || l.Replaces != nil || l.Algorithm != defaultAlgorithm {
		t.Errorf("override: %+v", l)
	}
	if got := l.MetricKey(es); got != l.FullKey || !l.MetricHasValues() {
		t.Errorf("override metric key %q (has values %v)", got, l.MetricHasValues())
	}
	if got := string(l.AppendCounterKey(nil, es)); got != "storefront_tenant_acme_route_anything_" {
		t.Errorf("override counter key %q", got)
	}
	// An entry without value is named by its key alone.
	l, _ = cfg.Override("storefront", ents("k", "", "j", "v"), 1, UnitSecond)
	if l.FullKey != "storefront.k.j_v" {
		t.Errorf("override without value: %q", l.FullKey)
	}
	if _, err := cfg.Override("storefront", es, 1, UnitUnknown); err == nil {
		t.Error("override with unit UNKNOWN: no error")
	}
	if _, err := cfg.Override("storefront", es, 1, Unit(99)); err == nil {
		t.Error("override with unit 99: no error")
	}
}

func TestOverrideKeyBounded(t *testing.T) {
	cfg := load(t, "nested.yaml")
	long := make([]byte, 64<<10)
	for i := range long {
		long[i] = 'v'
	}
	var es []Entry
	for range 50 {
		es = append(es, Entry{Key: "k", Value: string(long)})
	}
	l, err := cfg.Override("storefront", es, 1, UnitSecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.FullKey) > maxMetricKeyLen {
		t.Errorf("override key of %d bytes", len(l.FullKey))
	}
	other, _ := cfg.Override("storefront", es[:49], 1, UnitSecond)
	if other.FullKey == l.FullKey {
		t.Error("two different long overrides share a key")
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	cfg := load(t, "nested.yaml", "wildcard.yaml")
	cases := [][]Entry{
		ents("tenant", "acme", "route", "checkout"),
		ents("client_id", "someone-with-a-long-identifier-0123456789"),
		ents("path", "/static/fonts/a.woff"),
		ents("unknown", "x"),
	}
	for _, es := range cases {
		domain := "storefront"
		if es[0].Key == "path" {
			domain = "files"
		}
		if n := testing.AllocsPerRun(100, func() { cfg.Match(domain, es) }); n != 0 {
			t.Errorf("Match(%v) allocates %.0f times", es, n)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	cfg := load(b, "nested.yaml")
	es := ents("tenant", "acme", "route", "checkout")
	b.ReportAllocs()
	for b.Loop() {
		cfg.Match("storefront", es)
	}
}
