package tests

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// liftSite bans a key of zone lift for an hour after two denials; its key
// is X-Key, else X-User (a namespace of its own).
const liftSite = `
	rate_limit {
		key_digest_secret %s
		redis {
			address %s
			timeout 2s
		}
		zone lift {
			key {header.X-Key} {header.X-User}
			rate 1 1h
			ban 1h after 2 in 1m
		}
	}
	handle_errors 429 {
		respond "{http.error.message}" 429
	}
	respond "ok"`

// banBy sends requests with header until the node answers them banned.
func banBy(t *testing.T, n *node, header string) {
	t.Helper()
	for range 10 {
		if banned(n.get("/x", header)) {
			return
		}
	}
	t.Fatalf("%s was never banned", header)
}

// lift asks the admin API to lift the ban of target in zone lift.
func lift(n *node, target string) (int, string) {
	return n.adminDo(http.MethodDelete, "/rate_limit/bans?"+url.Values{"zone": {"lift"}, "key": {target}}.Encode())
}

// TestLiftBanByRawKeyOrDigest: DELETE /rate_limit/bans lifts a ban by the
// raw key a client sent, normalised as the zone normalises it (a long key
// is hashed; a second alternative's value is in a namespace of its own), or
// by the namespaced key itself; a ban missing from the registry is lifted
// by its raw key, and its digest is refused with a reason; a key without a
// ban answers 404 with a reason.
func TestLiftBanByRawKeyOrDigest(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(liftSite, digestSecret, r.Addr))

	long := "sk_live_" + strings.Repeat("0123456789", 10) // hashed: longer than 64 bytes
	banBy(t, n, "X-Key: "+long)
	if st, body := lift(n, long); st != 200 || !strings.Contains(body, `"lifted":[{`) {
		t.Errorf("lifting a hashed key by its raw value: %d %s, want it lifted", st, body)
	}
	if banned(n.get("/x", "X-Key: "+long)) {
		t.Errorf("the long key is still banned after its lift")
	}

	banBy(t, n, "X-User: u1")
	if st, body := lift(n, "u1"); st != 200 || !strings.Contains(body, `"lifted":[{`) {
		t.Errorf("lifting the second alternative's value by its raw value: %d %s, want it lifted", st, body)
	}
	banBy(t, n, "X-User: u2")
	if st, body := lift(n, "2,u2"); st != 200 || !strings.Contains(body, `"lifted":[{`) {
		t.Errorf("lifting by the namespaced key 2,u2: %d %s, want it lifted", st, body)
	}

	// A ban the registry lost: its digest cannot be resolved, and the
	// answer says so; its raw key lifts it.
	banBy(t, n, "X-Key: lost-user")
	n.waitBans("the ban of lost-user", func(l banList) bool {
		for _, b := range l.Bans {
			if b.KeyDigest == keyDigest("lost-user") {
				return true
			}
		}
		return false
	})
	r.MustDo("DEL", "rl:bans:{bans}:lift")
	st, body := lift(n, keyDigest("lost-user"))
	if st != 404 || !strings.Contains(body, "registry") || !strings.Contains(body, "raw key") {
		t.Errorf("lifting by the digest of a ban missing from the registry: %d %s, want 404 saying a digest needs the registry and to name the raw key", st, body)
	}
	if st, body := lift(n, "lost-user"); st != 200 || !strings.Contains(body, `"lifted":[{`) {
		t.Errorf("lifting a ban missing from the registry by its raw key: %d %s, want it lifted", st, body)
	}
	if banned(n.get("/x", "X-Key: lost-user")) {
		t.Errorf("lost-user is still banned after its lift")
	}

	st, body = lift(n, "nobody-banned")
	if st != 404 || !strings.Contains(body, `"error":`) || !strings.Contains(body, "no ban") {
		t.Errorf("lifting a key without a ban: %d %s, want 404 with a JSON reason", st, body)
	}
}
