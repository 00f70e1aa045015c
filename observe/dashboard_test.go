package observe

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestDashboardRedirectStaysOnSite: the rate_limit_dashboard handler sends a
// path without its trailing "/" to the same path with it and the same
// query, on the same site, whatever the path: `//evil.com` at a site's root
// must not become a redirect to evil.com.
func TestDashboardRedirectStaysOnSite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ target, want string }{
		{"/rate-limits", "/rate-limits/"},
		{"/rate-limits?series=10&x=%2F", "/rate-limits/?series=10&x=%2F"},
		{"//evil.com", "//evil.com/"},
		{"//evil.com?a=b", "//evil.com/?a=b"},
		{"///evil.com", "///evil.com/"},
		{"/%2F%2Fevil.com", "/%2F%2Fevil.com/"},
		{"/%5Cevil.com", "/%5Cevil.com/"},
		{"/javascript:alert(1)", "/javascript:alert(1)/"},
		{"/a//https:%2F%2Fevil.com", "/a//https:%2F%2Fevil.com/"},
	} {
		r := httptest.NewRequest(http.MethodGet, c.target, nil)
		w := httptest.NewRecorder()
		if err := (&DashboardHandler{}).ServeHTTP(w, r, nil); err != nil {
			t.Fatalf("%s: %v", c.target, err)
		}
		loc := w.Header().Get("Location")
		if w.Code != http.StatusPermanentRedirect {
			t.Fatalf("%s: status %d, want 308", c.target, w.Code)
		}
		ref, err := url.Parse(loc)
		if err != nil {
			t.Fatalf("%s: Location %q: %v", c.target, loc, err)
		}
		if ref.Scheme != "" || ref.Host != "" || strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, "/") || strings.ContainsRune(loc, '\\') {
			t.Errorf("%s: Location %q is not relative to the path", c.target, loc)
		}
		// Where a browser goes: this site, the path with a "/".
		base := &url.URL{Scheme: "https", Host: "site.example"}
		base.Path, base.RawPath = r.URL.Path, r.URL.RawPath
		base.RawQuery = r.URL.RawQuery
		got := base.ResolveReference(ref)
		if got.Host != "site.example" || got.Scheme != "https" {
			t.Errorf("%s: Location %q leaves the site: %s", c.target, loc, got)
		}
		if rel := got.RequestURI(); rel != c.want {
			t.Errorf("%s: Location %q goes to %s, want %s", c.target, loc, rel, c.want)
		}
	}

	// The page, its assets, the stats and the denial feed are served;
	// nothing else than GET and HEAD is redirected.
	for _, target := range []string{"/rate-limits/", "/rate-limits/stats", "/rate-limits/denials", "/rate-limits/dashboard.js"} {
		w := httptest.NewRecorder()
		if err := (&DashboardHandler{}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil), nil); err != nil || w.Code != http.StatusOK {
			t.Errorf("%s: status %d, %v", target, w.Code, err)
		}
	}
	w := httptest.NewRecorder()
	err := (&DashboardHandler{}).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "//evil.com", nil), nil)
	if loc := w.Header().Get("Location"); err == nil || loc != "" {
		t.Errorf("POST //evil.com: Location %q, error %v, want 405", loc, err)
	}
}
