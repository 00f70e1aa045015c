package fleetlimit

// BenchmarkServer is a whole Caddy server in this process, loaded from a
// Caddyfile as `caddy run` loads it, and called through its ServeHTTP
// without a network: Caddy's own per-request work (its request
// preparation, routes, handlers, error path, the header map net/http
// copies on WriteHeader) with none of the system calls and connection
// handling that make `go run ./cmd/bench` noisy. It compares a denial with
// what Caddy does for the same response without the limiter:
//
//	go test -run xxx -bench Server -benchmem -cpu 1 .
//
// plain is `respond "ok"`; fields the same with the five rate limit fields
// set by the header directive; static-429 `respond 429` with the denial's
// fields and Retry-After. The denial rows flood one key that is denied (or
// banned) on the memory store and on Redis (answered by the deny cache);
// handle_errors is the memory store's denial in a server that has
// handle_errors routes, so the denial goes through Caddy's error path.
// The admitted rows: a hot key, and 100,000 keys in turn (every one met
// before the measurement) against plain Caddy and the fields row with the
// same keys, with and without the fields (headers none).

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func BenchmarkServer(b *testing.B) {
	fields := "\theader {\n" +
		"\t\tRateLimit-Policy `\"bench\";q=100;w=1`\n\t\tRateLimit `\"bench\";r=0;t=1`\n" +
		"\t\tX-RateLimit-Limit 100\n\t\tX-RateLimit-Remaining 0\n\t\tX-RateLimit-Reset 1\n"
	limit := func(store, zone string) string {
		return "\trate_limit {\n" + store + "\t\tzone bench {\n\t\t\tkey {header.X-Key}\n\t\t\trate 100 1s\n" + zone + "\t\t}\n\t}\n\trespond \"ok\"\n"
	}
	const ban = "\t\t\tban 1h after 10 in 1m\n"
	// allow admits every request of the benchmark, as go run ./cmd/bench's
	// admitted rows do.
	allow := func(headers string) string {
		return "\trate_limit {\n" + headers + "\t\tzone bench {\n\t\t\tkey {header.X-Key}\n\t\t\trate 1000 1h\n\t\t\tburst 100000000\n\t\t}\n\t}\n\trespond \"ok\"\n"
	}
	var redisStore string // set when a Redis case runs
	cases := []struct {
		name   string
		site   func() string
		status int
		redis  bool
		keys   int // distinct keys, in turn (0: one hot key)
	}{
		{"plain", func() string { return "\trespond \"ok\"\n" }, 200, false, 0},
		{"fields", func() string { return fields + "\t}\n\trespond \"ok\"\n" }, 200, false, 0},
		{"static-429", func() string { return fields + "\t\tRetry-After 1\n\t}\n\trespond 429\n" }, 429, false, 0},
		{"memory-denied", func() string { return limit("", "") }, 429, false, 0},
		{"memory-banned", func() string { return limit("", ban) }, 429, false, 0},
		{"memory-denied-handle_errors", func() string { return limit("", "") + "\thandle_errors {\n\t\trespond 429\n\t}\n" }, 429, false, 0},
		{"redis-denied", func() string { return limit(redisStore, "") }, 429, true, 0},
		{"redis-banned", func() string { return limit(redisStore, ban) }, 429, true, 0},
		{"memory-admitted", func() string { return allow("") }, 200, false, 0},
		{"plain-100k-keys", func() string { return "\trespond \"ok\"\n" }, 200, false, 100000},
		{"fields-100k-keys", func() string { return fields + "\t}\n\trespond \"ok\"\n" }, 200, false, 100000},
		{"memory-admitted-100k-keys", func() string { return allow("") }, 200, false, 100000},
		{"memory-headers-none-100k-keys", func() string { return allow("\t\theaders none\n") }, 200, false, 100000},
	}
	for _, c := range cases {
		if c.redis && redisStore == "" {
			// Started by the parent: a sub-benchmark's cleanups run when
			// it ends.
			srv := redistest.Start(b)
			redisStore = fmt.Sprintf("\t\tredis {\n\t\t\taddress %s\n\t\t}\n", srv.Addr)
		}
		b.Run(c.name, func(b *testing.B) {
			s := loadServer(b, c.site())
			r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
			r.RemoteAddr = "192.0.2.7:41234"
			r.Header.Set("X-Key", "hot")
			keys := make([][]string, c.keys)
			for i := range keys {
				keys[i] = []string{fmt.Sprintf("client-%d", i)}
			}
			n := 0
			serve := func() int {
				if len(keys) > 0 {
					r.Header["X-Key"] = keys[n%len(keys)]
					n++
				}
				w := httptest.NewRecorder()
				s.ServeHTTP(w, r)
				return w.Code
			}
			for range 200 + len(keys) { // spend the tokens, start the ban, meet every key
				serve()
			}
			if got := serve(); got != c.status {
				b.Fatalf("status %d, want %d", got, c.status)
			}
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				serve()
			}
			// The process's CPU time (the garbage collector's included)
			// per request: unlike ns/op, not inflated when other processes
			// take the CPU.
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadServer runs Caddy with one site block on a free loopback port, and
// returns its server; it is stopped when the benchmark ends. Caddy logs at
// info level, its default, to a file.
func loadServer(b *testing.B, site string) *caddyhttp.Server {
	b.Helper()
	caddyfile := fmt.Sprintf("{\n\tadmin off\n\tpersist_config off\n\tauto_https off\n\tlog {\n\t\toutput file %s/caddy.log\n\t}\n}\n\n"+
		"http://127.0.0.1:%d {\n%s}\n", b.TempDir(), redistest.FreePort(b), site)
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		b.Fatalf("adapting %s: %v (%v)", caddyfile, err, warnings)
	}
	if err := caddy.Load(cfg, true); err != nil {
		b.Fatalf("loading %s: %v", caddyfile, err)
	}
	b.Cleanup(func() { _ = caddy.Stop() })
	app, err := caddy.ActiveContext().App("http")
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range app.(*caddyhttp.App).Servers {
		return s
	}
	b.Fatalf("no server in %s", strings.TrimSpace(caddyfile))
	return nil
}

// BenchmarkServerConcurrent is BenchmarkServer's admitted requests served
// by 50 goroutines at once, as 50 connections would be: on Redis the
// decisions waiting at the same time share round trips, as they do in
// `go run ./cmd/bench`, so the figure is Caddy's CPU per request with the
// store's batching (Redis' own CPU is another process's):
//
//	go test -run xxx -bench ServerConcurrent -benchmem -cpu 1 .
func BenchmarkServerConcurrent(b *testing.B) {
	srv := redistest.Start(b)
	redisStore := fmt.Sprintf("\t\tredis {\n\t\t\taddress %s\n\t\t}\n", srv.Addr)
	allow := func(store string) string {
		return "\trate_limit {\n" + store + "\t\tzone bench {\n\t\t\tkey {header.X-Key}\n\t\t\trate 1000 1h\n\t\t\tburst 100000000\n\t\t}\n\t}\n\trespond \"ok\"\n"
	}
	const keys = 100000
	for _, c := range []struct{ name, site string }{
		{"plain-100k-keys", "\trespond \"ok\"\n"},
		{"memory-100k-keys", allow("")},
		{"redis-100k-keys", allow(redisStore)},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := loadServer(b, c.site)
			var next atomic.Int64
			serve := func(r *http.Request, key []string) int {
				r.Header["X-Key"] = key
				w := httptest.NewRecorder()
				s.ServeHTTP(w, r)
				return w.Code
			}
			r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
			for i := range keys { // meet every key
				if got := serve(r, []string{fmt.Sprintf("client-%d", i)}); got != http.StatusOK {
					b.Fatalf("status %d, want 200", got)
				}
			}
			b.ReportAllocs()
			b.SetParallelism(50)
			calls0 := evalshaCalls(b, srv)
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
				r.RemoteAddr = "192.0.2.7:41234"
				for pb.Next() {
					i := next.Add(1) * 7919 % keys
					serve(r, []string{"client-" + strconv.FormatInt(i, 10)})
				}
			})
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			// Script calls per request: how well the decisions waiting at
			// once shared them (0 without Redis).
			b.ReportMetric(float64(evalshaCalls(b, srv)-calls0)/float64(b.N), "evalsha/op")
		})
	}
}

// evalshaCalls returns how many EVALSHA srv has run.
func evalshaCalls(b *testing.B, srv *redistest.Server) int64 {
	b.Helper()
	n, err := localfleet.ScriptCalls(srv)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
