package config

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestEveryKeyAccepted(t *testing.T) {
	cfg := load(t, "everykey.yaml")
	if w := cfg.Warnings(); len(w) != 0 {
		t.Errorf("warnings %q", w)
	}
	leaf := cfg.Match("every", ents("a", "1", "b", "2"))
	switch {
	case leaf == nil:
		t.Fatal("a=1, b=2 matched nothing")
	case leaf.Name != "leaf" || leaf.Unit != UnitHour || leaf.RequestsPerUnit != 16 || leaf.Unlimited:
		t.Errorf("leaf: %+v, want leaf, 16 (0x10) per HOUR", leaf)
	case len(leaf.Replaces) != 1 || leaf.Replaces[0] != "other":
		t.Errorf("leaf replaces %q", leaf.Replaces)
	case leaf.ShadowMode || leaf.QuotaMode:
		t.Errorf("leaf has its parent's modes: %+v", leaf)
	}
	// value_to_metric: True on a (a YAML 1.1 boolean, as the reference reads it).
	if got := leaf.MetricKey(ents("a", "1", "b", "2")); got != "every.a_1.b_2" || !leaf.MetricHasValues() {
		t.Errorf("leaf metric key %q", got)
	}
	// An alias of a rate_limit, and a descriptor merged from another.
	if c := cfg.Match("every", ents("c", "x")); c == nil || c.Name != "leaf" || c.RequestsPerUnit != 16 {
		t.Errorf("c (rate_limit: *hourly): %+v", c)
	}
	if d := cfg.Match("every", ents("d", "2")); d == nil || d.FullKey != "every.d_2" || d.Name != "leaf" {
		t.Errorf("d (<<: *leaf, key: d): %+v", d)
	}
	if e := cfg.Match("every", ents("e", "x")); e == nil || e.Name != "e_rule" || e.RequestsPerUnit != 3 || e.Unit != UnitHour {
		t.Errorf("e (merged rate_limit with its own keys): %+v", e)
	}
	if w := cfg.Match("every", ents("w", "xyz")); w == nil || w.MetricKey(ents("w", "xyz")) != "every.w_x*" {
		t.Errorf("w (share_threshold: y): %+v", w)
	}
	if n := cfg.Match("every", ents("nolimit", "x")); n != nil {
		t.Errorf("rate_limit: null made a rule: %+v", n)
	}
}

func TestMetadata(t *testing.T) {
	cfg := load(t, "metadata.yaml", "everykey.yaml")
	want := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		domain  string
		entries []Entry
		want    *structpb.Struct
	}{
		{"meta", ents("service", "s", "method", "m"), want(map[string]any{"name": "billing"})},
		{"meta", ents("quota", "q"), want(map[string]any{"with_quota": map[string]any{"tier": "gold", "weights": []any{3, 4}}})},
	} {
		l := cfg.Match(c.domain, c.entries)
		if l == nil || !proto.Equal(l.Metadata, c.want) {
			t.Errorf("%v: metadata %v, want %v", c.entries, l.Metadata, c.want)
		}
	}
	// Metadata on a level without a rule goes with no rule; its values are
	// kept as YAML gives them.
	a := cfg.Match("every", ents("a", "1", "b", "2"))
	if a.Metadata != nil {
		t.Errorf("metadata of the parent level on the leaf: %v", a.Metadata)
	}
	doc := "metadata:\n  s: text\n  n: 7\n  f: 2.5\n  b: true\n  z: ~\n  d: 2001-12-14\n  42: k\n  l: [1, x]\n"
	cfg2, err := Load([]File{{Name: "m.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n    " + strings.ReplaceAll(doc, "\n", "\n    "))}})
	if err != nil {
		t.Fatal(err)
	}
	got := cfg2.Match("m", ents("k", "")).Metadata.AsMap()
	wantMap := map[string]any{"s": "text", "n": 7.0, "f": 2.5, "b": true, "z": nil, "d": "2001-12-14", "42": "k", "l": []any{1.0, "x"}}
	if !proto.Equal(want(got), want(wantMap)) {
		t.Errorf("metadata values %v, want %v", got, wantMap)
	}
}

func TestWarnings(t *testing.T) {
	doc := `domain: w
unit: second
descriptors:
  - key: k
    unit: minute
    rate_limit:
      unit: second
      shadow_mode: true
      requests_per_unit: 1
      descriptors:
        - key: x
          bogus_but_ignored_by_nobody: 1
`
	_, err := Load([]File{{Name: "w.yaml", Data: []byte(doc)}})
	if err == nil || !strings.HasPrefix(err.Error(), `w.yaml:12: unknown key "bogus_but_ignored_by_nobody"`) {
		t.Errorf("an unknown key inside an ignored value: %v", err)
	}
	doc = strings.Replace(doc, "          bogus_but_ignored_by_nobody: 1\n", "", 1)
	cfg, err := Load([]File{{Name: "w.yaml", Data: []byte(doc + "---\ndomain: second\n")}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"w.yaml: only the file's first YAML document is read; the one at line 12 is ignored",
		"w.yaml:2: unit means nothing in the top level",
		"w.yaml:5: unit means nothing in a descriptor",
		"w.yaml:8: shadow_mode means nothing in rate_limit",
		"w.yaml:10: descriptors means nothing in rate_limit",
	}
	got := cfg.Warnings()
	if len(got) != len(want) {
		t.Fatalf("warnings %q, want %d", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("warning %d: %q, want %q...", i, got[i], want[i])
		}
	}
	if l := cfg.Match("w", ents("k", "v")); l == nil || l.ShadowMode {
		t.Errorf("shadow_mode inside rate_limit took effect: %+v", l)
	}
	if cfg.HasDomain("second") {
		t.Error("the second document was read")
	}
}

// Files in the form of the reference's examples: a leading document
// marker, values with slashes and dots, names and replaces.
func TestReferenceExamples(t *testing.T) {
	cfg := load(t, "replaces.yaml", "nested.yaml", "wildcard.yaml", "modes.yaml", "share.yaml", "metadata.yaml")
	if got := strings.Join(cfg.Domains(), ","); got != "files,gateway,meta,modes,share,storefront" {
		t.Errorf("domains %s", got)
	}
	if n := len(cfg.Limits()); n != 37 {
		t.Errorf("%d rules, want 37", n)
	}
	for _, l := range cfg.Limits() {
		if l.FullKey == "files.path_/static/fonts/*" {
			continue // an earlier wildcard, /static/*, takes its values
		}
		if m := cfg.Match(l.Domain, entriesOf(l)); m != l {
			t.Errorf("rule %s (%s) is not found by its own entries: %v", l.FullKey, l.Source, m)
		}
	}
}

// entriesOf returns entries that find l: each level's key and value, a
// wildcard's value extended.
func entriesOf(l *Limit) []Entry {
	es := make([]Entry, len(l.path))
	for i, n := range l.path {
		es[i] = Entry{Key: n.key, Value: strings.TrimSuffix(n.value, "*")}
		if n.wildcard {
			es[i].Value += "zz"
		}
	}
	return es
}
