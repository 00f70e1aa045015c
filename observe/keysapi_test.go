package observe

import (
	"cmp"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestKeyTarget: a keys route names its zone and key in the escaped path
// (a key's slashes and spaces escaped, or a bare slash within the key), in
// the query, or (POST and DELETE of keys/<zone> or keys?zone=Z) the key as
// the body; a route that names no key is refused. A key as long as a JWT
// in an Authorization header is named in every form; the body takes keys
// up to maxKeyBody.
func TestKeyTarget(t *testing.T) {
	t.Parallel()
	jwt := "Bearer " + strings.Repeat("eyJhbGciOiJSUzI1NiJ9.", 40) // 887 bytes
	long := strings.Repeat("k", maxKeyBody)
	for _, c := range []struct {
		method, url, body, zone, key string
		bad                          bool
	}{
		{url: "/rate_limit/keys/api/" + url.PathEscape(jwt), zone: "api", key: jwt},
		{url: "/rate_limit/keys?zone=api&key=" + url.QueryEscape(jwt), zone: "api", key: jwt},
		{method: "DELETE", url: "/rate_limit/keys/api/" + url.PathEscape(jwt), zone: "api", key: jwt},
		{method: "POST", url: "/rate_limit/keys/api", body: jwt, zone: "api", key: jwt},
		{method: "DELETE", url: "/rate_limit/keys/api", body: jwt, zone: "api", key: jwt},
		{method: "POST", url: "/rate_limit/keys/api%2Fv2", body: "a b\x00/c", zone: "api/v2", key: "a b\x00/c"},
		{method: "POST", url: "/rate_limit/keys/api", body: long, zone: "api", key: long},
		{method: "POST", url: "/rate_limit/keys/api", body: long + "k", bad: true},
		{method: "POST", url: "/rate_limit/keys/api", bad: true},
		{method: "DELETE", url: "/rate_limit/keys/api", bad: true},
		{method: "POST", url: "/rate_limit/keys?zone=api", body: jwt, zone: "api", key: jwt},
		{method: "DELETE", url: "/rate_limit/keys?zone=api", body: jwt, zone: "api", key: jwt},
		{method: "GET", url: "/rate_limit/keys?zone=api", body: jwt, bad: true},
		{url: "/rate_limit/keys/api/k1", zone: "api", key: "k1"},
		{url: "/rate_limit/keys/api/team%20a%2Fb", zone: "api", key: "team a/b"},
		{url: "/rate_limit/keys/api/a/b", zone: "api", key: "a/b"},
		{url: "/rate_limit/keys/api/2,u1", zone: "api", key: "2,u1"},
		{url: "/rate_limit/keys?zone=api&key=x%2By", zone: "api", key: "x+y"},
		{url: "/rate_limit/keys/api", bad: true},
		{url: "/rate_limit/keys/api/", bad: true},
		{url: "/rate_limit/keys?zone=api", bad: true},
	} {
		r := httptest.NewRequest(cmp.Or(c.method, "GET"), c.url, strings.NewReader(c.body))
		rest := ""
		if p := r.URL.EscapedPath(); len(p) > len(adminBase+"keys") {
			rest = p[len(adminBase+"keys"):]
		}
		zone, key, _, err := keyTarget(httptest.NewRecorder(), r, rest)
		switch {
		case c.bad && err == nil:
			t.Errorf("%s %.80s: names zone %q key of %d bytes, want an error", c.method, c.url, zone, len(key))
		case !c.bad && (err != nil || zone != c.zone || key != c.key):
			t.Errorf("%s %.80s: zone %q key of %d bytes (%v), want %q and %d bytes", c.method, c.url, zone, len(key), err, c.zone, len(c.key))
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
