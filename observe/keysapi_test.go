package observe

import (
	"net/http/httptest"
	"testing"
)

// TestKeyTarget: a keys route names its zone and key in the escaped path
// (a key's slashes and spaces escaped, or a bare slash within the key) or
// in the query; a route that names no key is refused.
func TestKeyTarget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url, zone, key string
		bad            bool
	}{
		{url: "/rate_limit/keys/api/k1", zone: "api", key: "k1"},
		{url: "/rate_limit/keys/api/team%20a%2Fb", zone: "api", key: "team a/b"},
		{url: "/rate_limit/keys/api/a/b", zone: "api", key: "a/b"},
		{url: "/rate_limit/keys/api/2,u1", zone: "api", key: "2,u1"},
		{url: "/rate_limit/keys?zone=api&key=x%2By", zone: "api", key: "x+y"},
		{url: "/rate_limit/keys/api", bad: true},
		{url: "/rate_limit/keys/api/", bad: true},
		{url: "/rate_limit/keys?zone=api", bad: true},
	} {
		r := httptest.NewRequest("GET", c.url, nil)
		rest := ""
		if p := r.URL.EscapedPath(); len(p) > len(adminBase+"keys") {
			rest = p[len(adminBase+"keys"):]
		}
		zone, key, err := keyTarget(r, rest)
		switch {
		case c.bad && err == nil:
			t.Errorf("%s: names zone %q key %q, want an error", c.url, zone, key)
		case !c.bad && (err != nil || zone != c.zone || key != c.key):
			t.Errorf("%s: zone %q key %q (%v), want %q %q", c.url, zone, key, err, c.zone, c.key)
		}
	}
}

// TestIsBucketKey: the bucket keys log_key shows are told from raw values.
func TestIsBucketKey(t *testing.T) {
	t.Parallel()
	for k, want := range map[string]bool{
		"2,u1": true, "3,#AAAAAAAAAAAAAAAAAAAAAA": true, "#AAAAAAAAAAAAAAAAAAAAAA": true,
		"u1": false, "1,u1": false, "x,u1": false, "2,": false, "a,b c": false, "#short": false,
	} {
		if got := isBucketKey(k); got != want {
			t.Errorf("isBucketKey(%q) = %v, want %v", k, got, want)
		}
	}
}
