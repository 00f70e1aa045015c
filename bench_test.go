package fleetlimit

// Micro-benchmarks of the handler's hot path, without network or Redis:
//
//	go test -run xxx -bench . -benchmem .
//
// BenchmarkNext is the baseline (the next handler alone); BenchmarkServeHTTP
// is the rate_limit handler in front of it on the memory store, so the
// difference is what the handler adds to a request. The request is prepared
// once, as Caddy prepares it (caddyhttp.PrepareRequest with a replacer), and
// reused with a fresh replacer each time (the handler registers the
// request's placeholders there; both benchmarks pay for the replacer):
// these are the handler's own costs, not Caddy's per-request setup. The
// whole server's work per request is BenchmarkServer, and the end-to-end
// comparison with plain Caddy is `go run ./cmd/bench`.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// benchHandler provisions a rate_limit handler from its JSON, as Caddy
// loads it; the context's cancellation (at the end of the benchmark) cleans
// it up.
func benchHandler(b *testing.B, raw string) *Handler {
	b.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("http.handlers.rate_limit", json.RawMessage(raw))
	if err != nil {
		b.Fatalf("loading the handler: %v", err)
	}
	h := mod.(*Handler)
	// A context without a config logs at debug level to the terminal;
	// Caddy's default log is at info level, where the handler's debug
	// logging costs one level check.
	h.logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	return h
}

// benchRequest is a request as Caddy hands it to handlers: a replacer with
// the HTTP placeholders in its context, and the vars (client_ip).
func benchRequest(key string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api/hello", nil)
	r.RemoteAddr = "192.0.2.7:41234"
	r.Header.Set("X-Key", key)
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, nil, nil)
	// Without a server PrepareRequest leaves the client IP empty; Caddy's
	// server sets it from the remote address (no trusted proxies).
	caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "192.0.2.7")
	return r, repl
}

// discardWriter is a ResponseWriter that keeps one header map (the handler
// sets the same fields on every request) and drops the body.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

var (
	okBody        = []byte("ok")
	okContentType = []string{"text/plain; charset=utf-8"}
)

// okHandler answers "ok", as `respond "ok"` does, without allocating, so
// that every allocation a benchmark reports is the rate_limit handler's.
var okHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
	w.Header()["Content-Type"] = okContentType
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(okBody)
	return err
})

// keyHeaders are the X-Key values of the random-key benchmarks, each as
// the header map holds it, so that switching keys allocates nothing.
func keyHeaders(n int) [][]string {
	v := make([][]string, n)
	for i := range v {
		v[i] = []string{"key" + strconv.Itoa(i)}
	}
	return v
}

func zoneJSON(name, key string, rate int64, per time.Duration, burst int64) string {
	return `{"name":"` + name + `","key":["` + key + `"],"rate":` + strconv.FormatInt(rate, 10) +
		`,"per":` + strconv.FormatInt(int64(per), 10) + `,"burst":` + strconv.FormatInt(burst, 10) + `}`
}

// withReplacer returns r with a fresh replacer in its context, as Caddy
// gives every request one, with the HTTP placeholders' provider.
func withReplacer(r *http.Request) *http.Request {
	repl := caddy.NewReplacer()
	repl.Map(func(string) (any, bool) { return nil, false })
	return r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
}

// BenchmarkNext is the baseline: the next handler alone.
func BenchmarkNext(b *testing.B) {
	r, _ := benchRequest("hot")
	w := &discardWriter{h: make(http.Header)}
	b.ReportAllocs()
	for b.Loop() {
		if err := okHandler.ServeHTTP(w, withReplacer(r)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServeHTTP is the handler on the memory store in front of the
// next handler: one hot key, 100,000 keys in turn, a hot key that is
// denied (the 429 handler error, and the 429 written in place), three
// zones, and headers none.
func BenchmarkServeHTTP(b *testing.B) {
	allow := zoneJSON("api", "{http.request.header.X-Key}", 1000, time.Hour, 100_000_000)
	deny := `{"zones":[` + zoneJSON("api", "{http.request.header.X-Key}", 1, time.Hour, 1) + `]}`
	cases := []struct {
		name    string
		handler string
		keys    int
		denied  bool
		inPlace bool // the handler writes the 429 (in a server without handle_errors)
	}{
		{"memory/hot", `{"zones":[` + allow + `]}`, 0, false, false},
		{"memory/100k-keys", `{"zones":[` + allow + `]}`, 100_000, false, false},
		{"memory/hot-denied", deny, 0, true, false},
		{"memory/hot-denied-in-place", deny, 0, true, true},
		{"memory/hot-banned-in-place", `{"zones":[` + strings.TrimSuffix(zoneJSON("api", "{http.request.header.X-Key}", 1, time.Hour, 1), "}") +
			`,"ban":{"duration":3600000000000,"after":1,"window":60000000000}}]}`, 0, true, true},
		{"memory/hot-3-zones", `{"zones":[` + allow + `,` + zoneJSON("ip", "{http.vars.client_ip}", 1000, time.Hour, 100_000_000) +
			`,` + zoneJSON("global", "all", 1000, time.Hour, 100_000_000) + `]}`, 0, false, false},
		{"memory/hot-headers-none", `{"headers":"none","zones":[` + allow + `]}`, 0, false, false},
		// An exempt list that does not hold the client, and one that does
		// (192.0.2.7, benchRequest's address): decided by no zone.
		{"memory/hot-exempt-list", `{"exempt":["10.0.0.0/8","2001:db8::/32"],"zones":[` + allow + `]}`, 0, false, false},
		{"memory/exempt", `{"exempt":["192.0.2.0/24"],"zones":[` + allow + `]}`, 0, false, false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := benchHandler(b, c.handler)
			h.denyAsError = !c.inPlace
			r, _ := benchRequest("hot")
			w := &discardWriter{h: make(http.Header)}
			var keys [][]string
			if c.keys > 0 {
				keys = keyHeaders(c.keys)
			}
			if c.denied {
				for range 3 { // spends the only token, starts a ban
					_ = h.ServeHTTP(w, withReplacer(r), okHandler)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if keys != nil {
					r.Header["X-Key"] = keys[i%len(keys)]
					i++
				}
				err := h.ServeHTTP(w, withReplacer(r), okHandler)
				if (err != nil) != (c.denied && !c.inPlace) {
					b.Fatalf("ServeHTTP: %v", err)
				}
			}
		})
	}
}

// BenchmarkKeyOf is the key of a zone for a request: a lone header
// placeholder, the default client_ip, a constant, text around a
// placeholder, and a long value that is hashed.
func BenchmarkKeyOf(b *testing.B) {
	long := strings.Repeat("k", 100)
	cases := []struct{ name, expr, header string }{
		{"header", "{http.request.header.X-Key}", "user-1234"},
		{"client-ip", "{http.vars.client_ip}", ""},
		{"constant", "all", ""},
		{"text-and-placeholder", "user:{http.request.header.X-Key}", "1234"},
		{"long-value-hashed", "{http.request.header.X-Key}", long},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := benchHandler(b, `{"zones":[`+zoneJSON("api", c.expr, 10, time.Second, 10)+`]}`)
			r, repl := benchRequest(c.header)
			z := h.Zones[0]
			if z.keyOf(r, repl) == "" {
				b.Fatal("empty key")
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = z.keyOf(r, repl)
			}
		})
	}
}

// BenchmarkHeaders is the rate limit header fields of a response, for one
// zone and for three, in each mode.
func BenchmarkHeaders(b *testing.B) {
	three := `{"zones":[` + zoneJSON("api", "{http.request.header.X-Key}", 100, time.Minute, 100) + `,` +
		zoneJSON("ip", "{http.vars.client_ip}", 1000, time.Hour, 1000) + `,` + zoneJSON("global", "all", 50, time.Second, 50) + `]}`
	h := benchHandler(b, three)
	results := []limiter.Result{
		{Allowed: true, Remaining: 97, ResetAfter: 1800 * time.Millisecond},
		{Allowed: true, Remaining: 998, ResetAfter: 7200 * time.Millisecond},
		{Allowed: true, Remaining: 12, ResetAfter: 760 * time.Millisecond},
	}
	for _, n := range []int{1, 3} {
		for _, mode := range []string{"both", "ietf", "legacy"} {
			b.Run(mode+"/"+strconv.Itoa(n)+"-zones", func(b *testing.B) {
				m, err := parseHeaderMode(mode)
				if err != nil {
					b.Fatal(err)
				}
				ds := make([]zoneDecision, n)
				for i, z := range h.Zones[:n] {
					ds[i] = zoneDecision{zone: z, applied: z.base, req: limiter.Request{Rule: z.rule}, res: results[i]}
				}
				policy := policyOf(ds)
				hdr := make(http.Header)
				b.ReportAllocs()
				for b.Loop() {
					m.write(hdr, ds, policy, noRetryAfter)
				}
			})
		}
	}
}

// nextNop is a next handler that does nothing.
var nextNop = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// BenchmarkObservability is the handler's cost with its metrics, stats and
// placeholders, against the same handler with disable_metrics (which keeps
// only the placeholders): an admitted and a denied request on the memory
// store, each with a fresh replacer as Caddy gives every request.
func BenchmarkObservability(b *testing.B) {
	for _, m := range []struct{ name, extra string }{{"metrics", ""}, {"disable_metrics", `,"disable_metrics":true`}} {
		for _, denied := range []bool{false, true} {
			name := m.name + "/admitted"
			rate := "1000000000"
			if denied {
				name, rate = m.name+"/denied", "1"
			}
			b.Run(name, func(b *testing.B) {
				zone := fmt.Sprintf("bench_%s_%v", m.name, denied)
				h := benchHandler(b, fmt.Sprintf(`{"headers":"none","zones":[{"name":%q,"key":["{http.request.header.X-Key}"],"rate":%s,"per":3600000000000}]%s}`, zone, rate, m.extra))
				h.logger = zap.NewNop() // Caddy logs at info level: a denial costs a level check
				base := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api", nil)
				base.Header.Set("X-Key", "hot")
				base = caddyhttp.PrepareRequest(base, caddy.NewReplacer(), nil, nil)
				w := httptest.NewRecorder()
				if denied {
					_ = h.ServeHTTP(w, base, nextNop)
				}
				b.ReportAllocs()
				for b.Loop() {
					// A fresh replacer on the prepared request's context
					// (not on the last iteration's: a chain of contexts
					// would grow with the loop).
					repl := caddy.NewReplacer()
					r := base.WithContext(context.WithValue(base.Context(), caddy.ReplacerCtxKey, repl))
					_ = h.ServeHTTP(w, r, nextNop)
				}
			})
		}
	}
}
