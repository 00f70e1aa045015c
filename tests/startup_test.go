package tests

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// startupConfig is a Caddyfile whose one zone denies when Redis fails
// (on_error deny), formatted with the admin address, the port, the Redis
// address and more redis subdirectives.
const startupConfig = `{
	admin %s
	persist_config off
	auto_https off
}

http://127.0.0.1:%d {
	rate_limit {
		redis {
			address %s
			%s
		}
		zone api {
			key {header.X-User}
			events 5
			window 1m
			on_error deny
		}
	}
	respond "ok"
}
`

// startOnPausedRedis starts Caddy on a paused Redis with the redis
// subdirectives extra, calls whileProvisioning once Caddy's admin endpoint
// listens (Caddy then provisions its handlers, and serves once they are
// provisioned), and returns the node once it serves, with how long it took
// from the admin endpoint listening.
func startOnPausedRedis(t *testing.T, srv *redistest.Server, extra string, whileProvisioning func()) (*node, time.Duration) {
	t.Helper()
	admin := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	port := redistest.FreePort(t)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(startupConfig, admin, port, srv.Addr, extra)), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	listening := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if c, err := net.Dial("tcp", admin); err == nil {
				c.Close()
				listening <- time.Now()
				whileProvisioning()
				return
			}
		}
	}()
	t.Cleanup(func() { <-done })
	n := localfleet.StartFile(t, caddyBin, file, admin, port)
	served := time.Now()
	select {
	case at := <-listening:
		return &node{Node: n, t: t, log: n.Log}, served.Sub(at)
	default:
		t.Fatal("caddy served before its admin endpoint was seen listening")
		return nil, 0
	}
}

// TestStartDecidesByRedis: a Caddy node that starts while its Redis answers
// late (paused until 300ms after Caddy's admin endpoint listens: a node
// restarted on a loaded machine, whose first connection and script load
// take that long) decides its first requests by Redis. It used to serve at
// once and answer them by on_error (the invariant checker's seeds 320035,
// 320036 and 320051: 503s of on_error deny, and an on_error allow admitting
// past the bound, just after a node started).
func TestStartDecidesByRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// A long max_wait and dial_timeout: a node that the machine's load
	// starves still reads Redis' replies in time once it resumes.
	n, _ := startOnPausedRedis(t, srv, "dial_timeout 5s\n\t\t\tmax_wait 5s", func() {
		time.Sleep(300 * time.Millisecond)
		srv.Resume()
	})
	if got := n.statuses(6, "/", "X-User: first"); got[200] != 5 || got[429] != 1 {
		t.Fatalf("the first requests of a node started while Redis answered late: %v; want 5 admitted and 1 denied by Redis, no 503 of on_error deny\ncaddy output:\n%s",
			got, n.log.String())
	}
}

// TestStartOnHungRedis: a Redis that does not answer at all as Caddy starts
// (paused throughout) delays Caddy's start by about dial_timeout + timeout,
// no more, and the requests are answered by on_error deny.
func TestStartOnHungRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	defer srv.Resume()
	n, took := startOnPausedRedis(t, srv, "dial_timeout 200ms\n\t\t\ttimeout 50ms\n\t\t\tmax_wait 300ms", func() {})
	t.Logf("caddy served %s after its admin endpoint listened", took)
	if took > 250*time.Millisecond+2*time.Second {
		t.Errorf("caddy served %s after its admin endpoint listened, Redis hung; want about dial_timeout + timeout (250ms)", took)
	}
	if r := n.get("/", "X-User: hung"); r.Status != 503 {
		t.Fatalf("a request with Redis hung: %d %q, want 503 (on_error deny)", r.Status, r.Body)
	}
	if !strings.Contains(n.log.String(), "redis did not answer as the rate limit store started") {
		t.Errorf("caddy did not warn that Redis did not answer at start-up\ncaddy output:\n%s", n.log.String())
	}
}

// TestReloadToHungRedisKeepsServing: a reload to a redis block that names
// another Redis, one that does not answer, waits for the new store's
// start-up (up to dial_timeout + timeout) while the running configuration
// keeps serving: no request waits for the reload. A request that paused
// for it would wait out most of it; one slowed by a busy machine waits far
// less, so the bound is half the reload's time (dial_timeout 4s).
func TestReloadToHungRedisKeepsServing(t *testing.T) {
	t.Parallel()
	up, hung := redistest.Start(t), redistest.Start(t)
	site := func(redis, extra, body string) string {
		return fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			%s
		}
		zone api {
			key {header.X-User}
			rate 1000 1h
		}
	}
	respond %q`, redis, extra, body)
	}
	n := startCaddy(t, "", site(up.Addr, "", "v1"))
	hung.Pause()
	defer hung.Resume()
	reloaded := make(chan error, 1)
	began := time.Now()
	go func() { reloaded <- n.Reload("", site(hung.Addr, "dial_timeout 4s", "v2")) }()
	slowest, served := time.Duration(0), 0
	for {
		select {
		case err := <-reloaded:
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(began)
			t.Logf("the reload took %s; %d requests served meanwhile, the slowest in %s", took, served, slowest)
			if took < time.Second {
				t.Fatalf("the reload took %s: it did not wait for the new store's start-up (dial_timeout 4s)", took)
			}
			if slowest > took/2 {
				t.Errorf("a request took %s during the reload of %s: serving paused", slowest, took)
			}
			if r := n.get("/", "X-User: after"); r.Status != 200 || r.Body != "v2" {
				t.Fatalf("after the reload: %d %q, want 200 v2 (local fallback while Redis hangs)", r.Status, r.Body)
			}
			return
		default:
		}
		sent := time.Now()
		r := n.get("/", "X-User: during")
		slowest = max(slowest, time.Since(sent))
		if r.Status != 200 || r.Body != "v1" && r.Body != "v2" {
			t.Fatalf("during the reload: %d %q", r.Status, r.Body)
		}
		served++
		time.Sleep(20 * time.Millisecond)
	}
}
