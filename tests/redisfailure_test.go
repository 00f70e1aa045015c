package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/keyflood"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// waitLog waits up to 10 s for the node's output to contain text.
func waitLog(t *testing.T, n *node, text string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(n.log.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say %q:\n%s", text, n.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settleLog waits until the node's output has not grown for 300 ms (at
// most 5 s): what the node wrote before has then reached the test.
func settleLog(n *node) {
	deadline := time.Now().Add(5 * time.Second)
	last := len(n.log.String())
	for quiet := time.Now(); time.Since(quiet) < 300*time.Millisecond && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if l := len(n.log.String()); l != last {
			last, quiet = l, time.Now()
		}
	}
}

// TestRedisNoEvictionOOM floods a node whose Redis has maxmemory 3mb and
// the default policy noeviction with 30,000 new keys (about 4 MB of
// buckets): the node warns at start that the policy lets buckets fill
// Redis (naming volatile-ttl), the failed script calls are counted under
// reason oom, the log says Redis is out of memory, and the zones keep
// limiting on local buckets (the default on_error).
func TestRedisNoEvictionOOM(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t, "--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
		}
		zone flood {
			key {header.X-Key}
			rate 100 24h
		}
	}
	respond "ok"`, r.Addr))
	waitLog(t, n, "volatile-ttl")
	if !strings.Contains(n.log.String(), "noeviction") {
		t.Fatalf("the memory warning does not name the policy:\n%s", n.log.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := keyflood.Run(ctx, keyflood.Flood{Addr: strings.TrimPrefix(n.URL, "http://"), Prefix: "f-", Requests: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	errs := m.By("reason", "caddy_rate_limit_store_errors_total")
	t.Logf("flood answers %v; store errors by reason %v", res.Status, errs)
	if errs["oom"] == 0 {
		t.Fatalf("no store error counted as oom: %v", errs)
	}
	waitLog(t, n, "Redis is out of memory")
	// Limits stay on: a key past its burst is denied on the local bucket.
	if got := n.statuses(101, "/", "X-Key: hot"); got[429] == 0 {
		t.Fatalf("a key over its burst with Redis out of memory: %v, want 429s (local fallback)", got)
	}
}

// TestRedisWrongPassword: a wrong password is named at start (WRONGPASS),
// counted under reason auth, and never shown.
func TestRedisWrongPassword(t *testing.T) {
	t.Parallel()
	const secret = "not-the-pa55word"
	r := redistest.Start(t, "--requirepass", "the-real-pa55word")
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			password %s
			timeout 2s
		}
		zone api {
			rate 100 1h
		}
	}
	respond "ok"`, r.Addr, secret))
	// A timeout of 2s: on a busy machine the default one ran out before
	// the refusal came back, and the call counted as a timeout.
	waitLog(t, n, "WRONGPASS")
	for range 3 {
		n.get("/")
	}
	m, err := n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("caddy_rate_limit_store_errors_total", "reason", "auth"); got == 0 {
		t.Fatalf("no store error counted as auth: %v", m.By("reason", "caddy_rate_limit_store_errors_total"))
	}
	if strings.Contains(n.log.String(), secret) || strings.Contains(n.log.String(), "the-real-pa55word") {
		t.Fatal("a password appears in the log")
	}
	if strings.Contains(n.log.String(), "unexpected type=<nil>") {
		t.Fatalf("the store reported a nil reply instead of the error:\n%s", n.log.String())
	}
}
