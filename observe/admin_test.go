package observe

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func adminGet(t *testing.T, method, path string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	w := httptest.NewRecorder()
	err := (&adminAPI{}).serve(w, httptest.NewRequest(method, path, nil))
	return w, err
}

func apiStatus(err error) int {
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return ae.HTTPStatus
	}
	return 0
}

func TestAdminRoutes(t *testing.T) {
	t.Parallel()
	if r := (&adminAPI{}).Routes(); len(r) != 1 || r[0].Pattern != "/rate_limit/" {
		t.Fatalf("routes %+v", r)
	}
	for _, c := range []struct{ path, ctype, contains string }{
		{"/rate_limit/", "text/html; charset=utf-8", `<script src="dashboard.js" defer crossorigin="anonymous">`},
		{"/rate_limit/dashboard.js", "text/javascript; charset=utf-8", "fetch(\"stats\""},
		{"/rate_limit/dashboard.css", "text/css; charset=utf-8", "svg.chart"},
	} {
		w, err := adminGet(t, http.MethodGet, c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if got := w.Header().Get("Content-Type"); got != c.ctype {
			t.Errorf("%s: Content-Type %q, want %q", c.path, got, c.ctype)
		}
		if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: Content-Security-Policy %q", c.path, csp)
		}
		if !strings.Contains(w.Body.String(), c.contains) {
			t.Errorf("%s: body lacks %q", c.path, c.contains)
		}
	}
	// Every asset is embedded: nothing refers to another origin.
	for _, file := range dashboardFiles {
		body, _ := dashboardFS.ReadFile(file)
		for _, ref := range []string{"http://", "https://", "//cdn"} {
			if strings.Contains(strings.ReplaceAll(string(body), "http://www.w3.org/2000/svg", ""), ref) {
				t.Errorf("%s refers to %q: every asset must be embedded", file, ref)
			}
		}
	}
	if w, err := adminGet(t, http.MethodHead, "/rate_limit/"); err != nil || w.Body.Len() != 0 {
		t.Errorf("HEAD: err %v, body %d bytes", err, w.Body.Len())
	}
	if _, err := adminGet(t, http.MethodGet, "/rate_limit/nope"); apiStatus(err) != http.StatusNotFound {
		t.Errorf("unknown path: %v, want 404", err)
	}
	if _, err := adminGet(t, http.MethodPost, "/rate_limit/stats"); apiStatus(err) != http.StatusMethodNotAllowed {
		t.Errorf("POST: %v, want 405", err)
	}
	if _, err := adminGet(t, http.MethodGet, "/rate_limit/stats?series=9999"); apiStatus(err) != http.StatusBadRequest {
		t.Errorf("series=9999: %v, want 400", err)
	}
	if w, err := adminGet(t, http.MethodGet, "/rate_limit/denials?zone=none&limit=5"); err != nil || w.Header().Get("Content-Type") != "application/json" ||
		!strings.Contains(w.Body.String(), `"denials":[]`) {
		t.Errorf("denials: %v, %q %s", err, w.Header().Get("Content-Type"), w.Body.String())
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=x"} {
		if _, err := adminGet(t, http.MethodGet, "/rate_limit/denials?"+q); apiStatus(err) != http.StatusBadRequest {
			t.Errorf("denials?%s: %v, want 400", q, err)
		}
	}
}
