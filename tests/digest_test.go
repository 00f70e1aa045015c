package tests

import (
	"regexp"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// keyDigestRE finds a key digest in the module's denial log lines.
var keyDigestRE = regexp.MustCompile(`"msg":"rate limit exceeded".*?"key_digest":"([A-Za-z0-9_-]{12})"`)

// denialDigest makes a node deny key and returns the digest its log shows.
func denialDigest(t *testing.T, n *node, key string) string {
	t.Helper()
	n.statuses(2, "/", "X-Key: "+key)
	waitLog(t, n, `"msg":"rate limit exceeded"`) // the output arrives through a pipe
	m := keyDigestRE.FindStringSubmatch(n.log.String())
	if m == nil {
		t.Fatalf("no denial line with a key digest:\n%s", n.log.String())
	}
	return m[1]
}

// TestKeyDigestSecretInStorage: without key_digest_secret, the digests are
// keyed with a secret generated once and kept in Caddy's storage, so two
// nodes sharing the storage give a key the same digest, and one with
// storage of its own another; none is the key's plain SHA-256 digest.
func TestKeyDigestSecretInStorage(t *testing.T) {
	t.Parallel()
	site := `
	rate_limit {
		zone digest {
			key {header.X-Key}
			rate 1 1h
		}
	}
	respond "ok"`
	home := t.TempDir()
	a := &node{Node: localfleet.StartNode(t, caddyBin, "debug", site, "HOME="+home), t: t}
	a.log = a.Node.Log
	b := &node{Node: localfleet.StartNode(t, caddyBin, "debug", site, "HOME="+home), t: t}
	b.log = b.Node.Log
	c := startCaddy(t, "debug", site) // a storage of its own
	da, db, dc := denialDigest(t, a, "203.0.113.9"), denialDigest(t, b, "203.0.113.9"), denialDigest(t, c, "203.0.113.9")
	if da != db {
		t.Fatalf("two nodes sharing Caddy's storage gave digests %q and %q", da, db)
	}
	if dc == da {
		t.Fatalf("a node with its own storage gave the same digest %q: the secret is not per deployment", dc)
	}
}
