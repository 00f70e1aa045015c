package fleetlimit

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestKeyExprFastPathsMatchReplacer checks that the header and client IP
// shortcuts give exactly what Caddy's replacer gives for the placeholder.
func TestKeyExprFastPathsMatchReplacer(t *testing.T) {
	t.Parallel()
	for _, headers := range [][]string{nil, {"one"}, {"a", "b"}, {""}, {"x y", "z"}} {
		req := httptest.NewRequest("GET", "http://example.com/", nil)
		for _, v := range headers {
			req.Header.Add("x-api-key", v)
		}
		ctx := context.WithValue(req.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "203.0.113.9"})
		req = req.WithContext(ctx)
		repl := caddyhttp.NewTestReplacer(req)
		for _, expr := range []string{"{http.request.header.X-Api-Key}", "{http.request.header.x-api-key}", "{http.vars.client_ip}"} {
			k := newKeyExpr(expr)
			if k.header == "" && !k.clientIP {
				t.Fatalf("%s: no fast path", expr)
			}
			want := repl.ReplaceKnown(expr, "")
			if got := k.eval(req, repl); got != want {
				t.Errorf("%s with %q: fast path %q, replacer %q", expr, headers, got, want)
			}
		}
	}
}
