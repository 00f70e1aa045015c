package fleetlimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// zoneName is a zone name of the test's own, since the memory store's
// buckets outlive handlers.
func zoneName(t *testing.T) string {
	return strings.NewReplacer("/", ".", " ", "_", "\"", "").Replace(t.Name())
}

// denialHandler provisions a handler whose one zone admits one request a
// minute per X-Key, with log_denials set to level (and log_key when
// logKey), on a clock the test sets.
func denialHandler(t *testing.T, level string, logKey bool, clock *atomic.Int64) (*Handler, *observer.ObservedLogs) {
	t.Helper()
	// The memory store is the process's: each test has zones of its own.
	raw := `{"rate_limits":{"` + zoneName(t) + `":{"key":"{http.request.header.X-Key}","window":"1m","max_events":1}},"log_denials":"` + level +
		`","log_key":` + strconv.FormatBool(logKey) + `}`
	return testHandler(t, raw, func(h *Handler) {
		h.now = func() time.Time { return time.Unix(clock.Load(), 0) }
	})
}

// TestLogDenialsInfo: at info, 1000 denials of one key in one second make
// one line with caddy-ratelimit's fields (zone, wait, remote_ip) and
// fleetlimit's (key_digest, cost, retry_after); the next second makes one
// more; another key has its own line.
func TestLogDenialsInfo(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(1_700_000_000)
	h, logs := denialHandler(t, "info", false, &clock)
	deny := func(n int, key string) {
		for range n {
			if status, _ := serve(t, h, request("GET", "192.0.2.9", "X-Key: "+key)); status != 429 && status != 200 {
				t.Fatalf("status %d", status)
			}
		}
	}
	deny(1001, "k1") // one admitted, 1000 denied
	lines := logs.FilterMessage(deniedMessage)
	if lines.Len() != 1 {
		t.Fatalf("1000 denials in one second: %d lines, want 1", lines.Len())
	}
	e := lines.All()[0]
	if e.Level != zapcore.InfoLevel {
		t.Errorf("level %v, want info", e.Level)
	}
	f := e.ContextMap()
	for _, k := range []string{"zone", "wait", "remote_ip", "key_digest", "cost", "retry_after"} {
		if _, ok := f[k]; !ok {
			t.Errorf("no field %q in %v", k, f)
		}
	}
	if f["zone"] != zoneName(t) || f["remote_ip"] != "192.0.2.9" || f["cost"] != int64(1) {
		t.Errorf("fields %v", f)
	}
	if w, ok := f["wait"].(time.Duration); !ok || w <= 0 || w > time.Minute {
		t.Errorf("wait %v, want the wait up to a minute", f["wait"])
	}
	if _, ok := f["key"]; ok {
		t.Errorf("the key is logged without log_key: %v", f)
	}
	deny(10, "k2")
	clock.Add(1)
	deny(1000, "k1")
	if n := logs.FilterMessage(deniedMessage).Len(); n != 3 {
		t.Errorf("k1 in two seconds and k2 in one: %d lines, want 3", n)
	}
}

// TestLogDenialsLogKey: with log_key the line carries the key itself, as
// caddy-ratelimit's did.
func TestLogDenialsLogKey(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(1)
	h, logs := denialHandler(t, "info", true, &clock)
	for range 3 {
		serve(t, h, request("GET", "192.0.2.9", "X-Key: alice"))
	}
	lines := logs.FilterMessage(deniedMessage).All()
	if len(lines) != 1 || lines[0].ContextMap()["key"] != "alice" {
		t.Fatalf("lines %v, want one with key alice", lines)
	}
	if _, ok := lines[0].ContextMap()["key_digest"]; ok {
		t.Errorf("key_digest as well as key: %v", lines[0].ContextMap())
	}
}

// TestLogDenialsOffAndDebug: off logs no denial; debug (the default)
// logs every one at debug level and none at info.
func TestLogDenialsOffAndDebug(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level       string
		debug, info int
	}{{"off", 0, 0}, {"debug", 100, 0}, {"", 100, 0}} {
		var clock atomic.Int64
		h, logs := denialHandler(t, c.level, false, &clock)
		for range 101 {
			serve(t, h, request("GET", "192.0.2.9", "X-Key: k"+c.level))
		}
		lines := logs.FilterMessage(deniedMessage)
		if d, i := lines.FilterLevelExact(zapcore.DebugLevel).Len(), lines.FilterLevelExact(zapcore.InfoLevel).Len(); d != c.debug || i != c.info {
			t.Errorf("log_denials %q: %d debug and %d info lines, want %d and %d", c.level, d, i, c.debug, c.info)
		}
	}
}

// TestDenialThrottleBounded: a flood of distinct keys in one second is
// logged at most denialShards x denialShardKeys times, the throttle never
// remembers more keys than that, and the lines left out are counted once
// in the next second.
func TestDenialThrottleBounded(t *testing.T) {
	t.Parallel()
	const limit = denialShards * denialShardKeys
	th := newDenialThrottle()
	logged := 0
	const flood = 100_000
	for i := range flood {
		ok, dropped := th.admit("api", "key"+strconv.Itoa(i), 10)
		if dropped != 0 {
			t.Fatalf("dropped reported within the second: %d", dropped)
		}
		if ok {
			logged++
		}
		if i%1000 == 0 && th.size() > limit {
			t.Fatalf("after %d keys the throttle holds %d, above its cap %d", i, th.size(), limit)
		}
	}
	if logged > limit || logged < limit/2 {
		t.Errorf("%d of %d keys logged in one second, want at most %d (and most of it)", logged, flood, limit)
	}
	if th.size() > limit {
		t.Errorf("size %d above the cap %d", th.size(), limit)
	}
	ok, dropped := th.admit("api", "key0", 11)
	if !ok || dropped != int64(flood-logged) {
		t.Errorf("next second: admitted %v, dropped %d; want true and %d", ok, dropped, flood-logged)
	}
	if _, again := th.admit("api", "key1", 11); again != 0 {
		t.Errorf("dropped reported twice: %d", again)
	}
	if ok, _ := th.admit("api", "key0", 11); ok {
		t.Error("the same key twice in one second")
	}
	if ok, _ := th.admit("other", "key0", 11); !ok {
		t.Error("another zone's denial of the same key is a line of its own")
	}
}

// TestDenialInPlace: where nothing would see a handler error, a denial is
// written by the handler: 429 with no body, the rate limit fields and
// Retry-After, the exceeded placeholder set, and no error returned; the
// same denial as a handler error carries the same fields.
func TestDenialInPlace(t *testing.T) {
	t.Parallel()
	raw := `{"zones":[{"name":"` + zoneName(t) + `","key":["{http.request.header.X-Key}"],"rate":1,"per":60000000000}]}`
	for _, inPlace := range []bool{true, false} {
		h, _ := testHandler(t, raw)
		h.denyAsError = !inPlace
		next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
		key := "X-Key: " + strconv.FormatBool(inPlace)
		if err := h.ServeHTTP(httptest.NewRecorder(), request("GET", "192.0.2.1", key), next); err != nil {
			t.Fatalf("first request: %v", err)
		}
		r := request("GET", "192.0.2.1", key)
		w := httptest.NewRecorder()
		err := h.ServeHTTP(w, r, next)
		if inPlace {
			if err != nil || w.Code != http.StatusTooManyRequests || w.Body.Len() != 0 {
				t.Errorf("in place: error %v, status %d, body %q; want nil, 429, none", err, w.Code, w.Body.String())
			}
		} else {
			var he caddyhttp.HandlerError
			if !errors.As(err, &he) || he.StatusCode != http.StatusTooManyRequests || he.ID == "" {
				t.Errorf("as error: %#v, want a 429 handler error with an ID", err)
			}
		}
		for _, f := range []string{"Retry-After", "Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
			if w.Header().Get(f) == "" {
				t.Errorf("in place %v: no %s field", inPlace, f)
			}
		}
		if got := w.Header().Get("Retry-After"); got != "60" {
			t.Errorf("in place %v: Retry-After %q, want 60", inPlace, got)
		}
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if name, _ := repl.GetString("http.rate_limit.exceeded.name"); name != zoneName(t) {
			t.Errorf("in place %v: exceeded placeholder %q", inPlace, name)
		}
	}
}

// TestDenialAnswer: a handler provisioned in a server answers denials in
// place unless something would see the handler error: the server's
// handle_errors routes (rate_limit among them or not), an enclosing
// subroute's errors routes, the HTTP app's metrics, or logs at debug
// level.
func TestDenialAnswer(t *testing.T) {
	handler := `{"handler":"rate_limit","zones":[{"name":"` + zoneName(t) + `","key":["{http.request.header.X-Key}"],"rate":1,"per":60000000000}]}`
	respond := `{"handler":"static_response","status_code":429}`
	// Each server on a loopback address of its own, on any free port.
	addr := 0
	server := func(routes, errors string) string {
		addr++
		s := `{"listen":["127.0.0.` + strconv.Itoa(addr) + `:0"],"automatic_https":{"disable":true},"routes":[{"handle":[` + routes + `]}]`
		if errors != "" {
			s += `,"errors":{"routes":[{"handle":[` + errors + `]}]}`
		}
		return s + `}`
	}
	subroute := func(errors string) string {
		s := `{"handler":"subroute","routes":[{"handle":[` + handler + `]}]`
		if errors != "" {
			s += `,"errors":{"routes":[{"handle":[` + errors + `]}]}`
		}
		return s + `}`
	}
	servers := `"servers":{` +
		`"plain":` + server(handler, "") + `,` +
		`"subroute":` + server(subroute(""), "") + `,` +
		`"handle_errors":` + server(handler, respond) + `,` +
		`"subroute_errors":` + server(subroute(respond), "") + `}`
	// Not discarded: Caddy gives a log that discards its lines a core that
	// is enabled at no level.
	logFile, _ := json.Marshal(filepath.Join(t.TempDir(), "caddy.log"))
	config := func(level, app string) string {
		return `{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"` + level + `","writer":{"output":"file","filename":` +
			string(logFile) + `}}}},` +
			`"apps":{"http":{` + app + servers + `}}}`
	}
	// handlerOf returns the rate_limit handler of a server's first route,
	// or of the subroute there.
	handlerOf := func(srv *caddyhttp.Server) *Handler {
		mh := srv.Routes[0].Handlers[0]
		if sr, ok := mh.(*caddyhttp.Subroute); ok {
			mh = sr.Routes[0].Handlers[0]
		}
		return mh.(*Handler)
	}
	cases := []struct {
		name, level, app string
		asError          map[string]bool // by server
	}{
		{"info", "INFO", "", map[string]bool{"plain": false, "subroute": false, "handle_errors": true, "subroute_errors": true}},
		{"metrics", "INFO", `"metrics":{},`, map[string]bool{"plain": true, "subroute": true, "handle_errors": true, "subroute_errors": true}},
		{"debug", "DEBUG", "", map[string]bool{"plain": true, "subroute": true, "handle_errors": true, "subroute_errors": true}},
	}
	for _, c := range cases {
		if err := caddy.Load([]byte(config(c.level, c.app)), true); err != nil {
			t.Fatalf("%s: loading the config: %v", c.name, err)
		}
		app, err := caddy.ActiveContext().App("http")
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range c.asError {
			if got := handlerOf(app.(*caddyhttp.App).Servers[name]).denyAsError; got != want {
				t.Errorf("%s, server %s: denials as handler errors %v, want %v", c.name, name, got, want)
			}
		}
	}
	if err := caddy.Stop(); err != nil {
		t.Error(err)
	}
}
