package config

import (
	"strings"
	"testing"
)

// runMetricKeys checks the metric key of each case's match (its want).
func runMetricKeys(t *testing.T, cfg *Config, cases []matchCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := cfg.Match(c.domain, c.entries)
			if l == nil {
				t.Fatalf("Match(%v) = nil", c.entries)
			}
			if got := l.MetricKey(c.entries); got != c.want {
				t.Errorf("MetricKey(%v) = %q, want %q", c.entries, got, c.want)
			}
		})
	}
}

func TestMetricKeyDefault(t *testing.T) {
	cfg := load(t, "nested.yaml", "wildcard.yaml")
	runMetricKeys(t, cfg, []matchCase{
		{"key only", "storefront", ents("client_id", "c1"), "storefront.client_id"},
		{"key and value", "storefront", ents("client_id", "partner"), "storefront.client_id_partner"},
		{"nested", "storefront", ents("tenant", "acme", "route", "/x"), "storefront.tenant_acme.route"},
		{"wildcard keeps its pattern", "files", ents("path", "/static/a.css"), "files.path_/static/*"},
		{"detailed keeps the value", "storefront", ents("session", "s-77"), "storefront.session_s-77"},
		{"detailed with an empty value", "storefront", ents("session", ""), "storefront.session_"},
	})
	if l := cfg.Match("storefront", ents("client_id", "c1")); l.MetricHasValues() {
		t.Error("a rule without detailed_metric or value_to_metric says its metric key holds values")
	}
	if l := cfg.Match("storefront", ents("session", "s")); !l.MetricHasValues() {
		t.Error("a detailed_metric rule says its metric key holds no values")
	}
}

// valuesConfig is a domain with value_to_metric and detailed_metric in
// the combinations the reference's statistics distinguish.
const valuesConfig = `
domain: v
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: verb
        value_to_metric: true
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: verb
        value: PUT
        value_to_metric: true
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 30}
      - key: verb
        value: DELETE
        descriptors:
          - key: user
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 20}
  - key: a
    descriptors:
      - key: b
        value_to_metric: true
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: op
    value: read*
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: star
    value: s*
    descriptors:
      - key: inner
        value_to_metric: true
        descriptors:
          - key: leaf
            rate_limit: {unit: second, requests_per_unit: 3}
  - key: top
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 4}
`

func TestMetricKeyValueToMetric(t *testing.T) {
	cfg, err := Load([]File{{Name: "v.yaml", Data: []byte(valuesConfig)}})
	if err != nil {
		t.Fatal(err)
	}
	runMetricKeys(t, cfg, []matchCase{
		{"values of flagged levels", "v", ents("route", "shop", "verb", "GET", "user", "u1"), "v.route_shop.verb_GET.user"},
		{"configured value", "v", ents("route", "shop", "verb", "PUT", "user", "u1"), "v.route_shop.verb_PUT.user"},
		{"detailed wins", "v", ents("route", "shop", "verb", "DELETE", "user", "u1"), "v.route_shop.verb_DELETE.user_u1"},
		{"middle level only", "v", ents("a", "1", "b", "2", "c", "3"), "v.a.b_2.c"},
		{"empty values", "v", ents("route", "", "verb", "", "user", "u"), "v.route.verb.user"},
		{"wildcard with value_to_metric", "v", ents("op", "readme"), "v.op_readme"},
		{"wildcard elsewhere keeps its pattern", "v", ents("star", "sun", "inner", "i", "leaf", "l"), "v.star_s*.inner_i.leaf"},
		{"top level", "v", ents("top", "t1"), "v.top_t1"},
	})
	l := cfg.Match("v", ents("route", "shop", "verb", "GET", "user", "u1"))
	if !l.MetricHasValues() || l.FullKey != "v.route.verb.user" {
		t.Errorf("value_to_metric rule: has values %v, full key %q", l.MetricHasValues(), l.FullKey)
	}
}

func TestMetricKeyBounded(t *testing.T) {
	cfg, err := Load([]File{{Name: "v.yaml", Data: []byte(valuesConfig)}})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 10_000)
	for _, es := range [][]Entry{
		ents("top", long),
		ents("top", "with space"),
		ents("route", long, "verb", long, "user", long),
	} {
		got := cfg.Match("v", es).MetricKey(es)
		if len(got) > maxMetricKeyLen || strings.Contains(got, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx") || strings.Contains(got, " ") {
			t.Errorf("metric key of %d bytes not bounded: %.80q", len(got), got)
		}
	}
	a := cfg.Match("v", ents("top", long+"a")).MetricKey(ents("top", long+"a"))
	b := cfg.Match("v", ents("top", long+"b")).MetricKey(ents("top", long+"b"))
	if a == b {
		t.Error("two long values share a metric key")
	}
}

func TestShareThreshold(t *testing.T) {
	cfg := load(t, "share.yaml")
	runMetricKeys(t, cfg, []matchCase{
		{"one shared key", "share", ents("doc", "reports/2024.pdf"), "share.doc_reports/*"},
		{"nested", "share", ents("team", "blue", "doc", "drafts/a"), "share.team_blue.doc_drafts/*"},
		{"two levels shared", "share", ents("doc", "top/x", "doc", "inner/y"), "share.doc_top/*.doc_inner/*"},
		{"wins over value_to_metric", "share", ents("endpoint", "v2/users", "verb", "GET"), "share.endpoint_v2/*.verb"},
		{"wins over detailed_metric", "share", ents("svc", "billing/eu", "op", "charge"), "share.svc_billing/*.op_charge"},
		{"wildcard without share keeps its pattern", "share", ents("dir", "home/al", "sub", "music/x", "kind", "mp3"), "share.dir_home/*.sub_music/*.kind"},
		{"exact value is its own", "share", ents("report", "q1"), "share.report_q1"},
		{"wildcard shared", "share", ents("report", "q12"), "share.report_q*"},
	})

	counter := func(es []Entry) string {
		l := cfg.Match("share", es)
		return string(l.AppendCounterKey(nil, es))
	}
	for _, c := range []struct {
		entries []Entry
		want    string
	}{
		{ents("doc", "reports/a"), "share_doc_reports/*_"},
		{ents("doc", "reports/b"), "share_doc_reports/*_"},
		{ents("team", "blue", "doc", "drafts/z"), "share_team_blue_doc_drafts/*_"},
		{ents("doc", "top/1", "doc", "inner/2"), "share_doc_top/*_doc_inner/*_"},
		{ents("dir", "home/al", "sub", "music/x", "kind", "mp3"), "share_dir_home/*_sub_music/x_kind_mp3_"},
		{ents("report", "q1"), "share_report_q1_"},
		{ents("report", "q7"), "share_report_q*_"},
	} {
		if got := counter(c.entries); got != c.want {
			t.Errorf("counter key of %v = %q, want %q", c.entries, got, c.want)
		}
	}
	es := ents("dir", "home/al", "sub", "music/x", "kind", "mp3")
	l := cfg.Match("share", es)
	for i, want := range []string{"home/*", "music/x", "mp3"} {
		if got := l.CounterValue(es, i); got != want {
			t.Errorf("CounterValue(%d) = %q, want %q", i, got, want)
		}
	}
}

func TestCounterKey(t *testing.T) {
	cfg := load(t, "nested.yaml")
	es := ents("tenant", "acme", "route", "/cart")
	l := cfg.Match("storefront", es)
	if got := string(l.AppendCounterKey([]byte("prefix:"), es)); got != "prefix:storefront_tenant_acme_route_/cart_" {
		t.Errorf("counter key %q", got)
	}
	es = ents("client_id", "")
	if got := string(cfg.Match("storefront", es).AppendCounterKey(nil, es)); got != "storefront_client_id__" {
		t.Errorf("counter key of an empty value %q", got)
	}
}
