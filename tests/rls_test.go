package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// rlsGlobals is the rate_limit_rls global option in the form issue 33
// gives, with this test's port, directory and Redis, and redisLines added
// to its redis block.
func rlsGlobals(port int, dir, redisAddr string, redisLines ...string) string {
	var extra string
	for _, l := range redisLines {
		extra += "\n\t\t\t" + l
	}
	return fmt.Sprintf(`	rate_limit_rls {
		listen 127.0.0.1:%d
		config_dir %s
		redis {
			address %s%s
		}
	}`, port, dir, redisAddr, extra)
}

// rlsRules writes a domain with one rule of limit per hour into dir.
func rlsRules(t *testing.T, dir string, limit int) {
	t.Helper()
	yaml := fmt.Sprintf("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", limit)
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startRLSCaddy starts Caddy with rate_limit_rls (rlsGlobals, with
// redisLines) on the rules in dir and the Redis at redisAddr, serving
// site, and returns the node and a client of the service.
func startRLSCaddy(t *testing.T, dir, redisAddr, site string, redisLines ...string) (*node, rlsv3.RateLimitServiceClient) {
	t.Helper()
	port := redistest.FreePort(t)
	n := startCaddy(t, rlsGlobals(port, dir, redisAddr, redisLines...), site)
	return n, rlsClient(t, port)
}

// rlsClient returns a plaintext client of the service on a loopback port,
// closed when the test ends.
func rlsClient(t *testing.T, port int) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// rlsCall is one ShouldRateLimit call with a deadline.
func rlsCall(client rlsv3.RateLimitServiceClient, deadline time.Duration, ip string) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	return client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
	}})
}

// TestRLSCaddy runs the service in a Caddy built from cmd/caddy, from the
// Caddyfile form of issue 33: it answers Envoy's calls from Redis, and a
// reload (a new limit) neither drops a call in flight nor keeps the old
// limit.
func TestRLSCaddy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	rlsRules(t, dir, 3)
	port := redistest.FreePort(t)
	n := startCaddy(t, rlsGlobals(port, dir, srv.Addr), `respond "ok"`)
	client := rlsClient(t, port)
	// Answers, not time: a loaded machine gets seconds.
	for i, want := range []string{"OK", "OK", "OK", "OVER_LIMIT"} {
		resp, err := rlsCall(client, 10*time.Second, "192.0.2.1")
		if err != nil || resp.OverallCode.String() != want {
			t.Fatalf("call %d: %v %v, want %s", i, resp.GetOverallCode(), err, want)
		}
	}
	if keys := srv.MustDo("DBSIZE"); keys == "0" {
		t.Fatal("the service's calls left nothing in Redis")
	}

	// Calls in flight through a reload that raises the limit to 1000.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	calls := 0
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := rlsCall(client, 10*time.Second, fmt.Sprintf("198.51.100.%d", w))
				mu.Lock()
				calls++
				if err != nil {
					failures = append(failures, err)
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	rlsRules(t, dir, 1000)
	// Caddy reloads only a configuration that changed (or with --force):
	// the site's answer changes with the rules.
	n.reload(rlsGlobals(port, dir, srv.Addr), `respond "reloaded"`)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed across the reload, the first: %v", len(failures), calls, failures[0])
	}
	resp, err := rlsCall(client, 10*time.Second, "192.0.2.1")
	if err != nil || resp.OverallCode.String() != "OK" || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1000 {
		t.Fatalf("after the reload: %v %v, want OK at the new limit of 1000", resp, err)
	}
	t.Logf("%d calls across the reload, none failed", calls)
}

// TestRLSZoneShared: a rule that names a rate_limit zone spends the zone's
// bucket: Envoy's calls for an address and Caddy's requests from it count
// against one limit.
func TestRLSZoneShared(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	yaml := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {zone: api}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	site := fmt.Sprintf(`rate_limit {
		redis {
			address %s
		}
		zone api {
			key {client_ip}
			rate 4 1h
		}
	}
	respond "ok"`, srv.Addr)
	n, client := startRLSCaddy(t, dir, srv.Addr, site)
	// Two requests through Caddy from 127.0.0.1, two calls for it: the
	// zone's 4 are spent, whichever way they came.
	for i := range 2 {
		if r := n.get("/"); r.Status != 200 {
			t.Fatalf("request %d: %d", i, r.Status)
		}
		resp, err := rlsCall(client, 10*time.Second, "127.0.0.1")
		if err != nil || resp.OverallCode.String() != "OK" {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
		if cur := resp.Statuses[0].CurrentLimit; cur.GetRequestsPerUnit() != 4 || cur.GetUnit().String() != "HOUR" {
			t.Fatalf("current_limit %v, want the zone's 4 per HOUR", cur)
		}
	}
	if r := n.get("/"); r.Status != 429 {
		t.Fatalf("a fifth request through Caddy: %d, want 429 (the RLS calls spent the zone)", r.Status)
	}
	resp, err := rlsCall(client, 10*time.Second, "127.0.0.1")
	if err != nil || resp.OverallCode.String() != "OVER_LIMIT" {
		t.Fatalf("a fifth call: %v %v, want OVER_LIMIT", resp, err)
	}
}
