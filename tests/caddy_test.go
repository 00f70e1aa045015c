// Package tests runs fleetlimit end to end: real Caddy processes built from
// cmd/caddy, real redis-server processes, real HTTP on loopback.
package tests

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// caddyBin is the Caddy binary built once for the whole test run, in
// binDir.
var caddyBin, binDir string

func TestMain(m *testing.M) {
	var err error
	binDir, err = os.MkdirTemp("", "fleetlimit-tests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caddyBin, err = localfleet.BuildCaddy(binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The clock-skewed build links while the serial tests run, not in
	// TestFleetClockSkew's share of the parallel ones; only when a test
	// that needs it is selected, and waited for before the binaries are
	// removed.
	flag.Parse()
	skewed := selected(skewedTests)
	if skewed {
		go func() { _, _ = buildSkewedCaddy() }()
	}
	code := m.Run()
	if skewed {
		_, _ = buildSkewedCaddy()
	}
	os.RemoveAll(binDir)
	os.Exit(code)
}

// skewedCaddy returns Caddy built with the test hook that shifts the
// node's clock by FLEETLIMIT_CLOCK_SKEW, built once for the tests that
// need it.
func skewedCaddy(t *testing.T) string {
	t.Helper()
	bin, err := buildSkewedCaddy()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// skewedTests are the tests that run the clock-skewed build.
var skewedTests = []string{"TestFleetClockSkew", "TestClockDrift"}

// selected reports whether -test.run may select one of the tests named
// (its top-level part matches one; no pattern selects them all).
func selected(names []string) bool {
	f := flag.Lookup("test.run")
	if f == nil || f.Value.String() == "" {
		return true
	}
	top, _, _ := strings.Cut(f.Value.String(), "/")
	re, err := regexp.Compile(top)
	if err != nil {
		return true
	}
	for _, n := range names {
		if re.MatchString(n) {
			return true
		}
	}
	return false
}

var buildSkewedCaddy = sync.OnceValues(func() (string, error) {
	return localfleet.BuildCaddy(binDir, "fleetlimit_clockskew")
})

// node is a Caddy process bound to the test that started it.
type node struct {
	*localfleet.Node
	t   *testing.T
	log *localfleet.SyncBuffer
}

// startCaddy runs Caddy with globals in the global options block and site
// in a site block on a free port.
func startCaddy(t *testing.T, globals, site string) *node {
	t.Helper()
	n := localfleet.StartNode(t, caddyBin, globals, site)
	return &node{Node: n, t: t, log: n.Log}
}

func (n *node) reload(globals, site string) {
	n.t.Helper()
	if err := n.Reload(globals, site); err != nil {
		n.t.Fatalf("%v\ncaddy output:\n%s", err, n.log.String())
	}
}

type response = localfleet.Response

func (n *node) do(method, path string, headers ...string) response {
	n.t.Helper()
	r, err := n.Do(method, path, headers...)
	if err != nil {
		n.t.Fatalf("%s %s: %v\ncaddy output:\n%s", method, path, err, n.log.String())
	}
	return r
}

func (n *node) get(path string, headers ...string) response {
	n.t.Helper()
	return n.do(http.MethodGet, path, headers...)
}

// statuses sends count GET requests and returns how many got each status.
func (n *node) statuses(count int, path string, headers ...string) map[int]int {
	n.t.Helper()
	got := map[int]int{}
	for range count {
		got[n.get(path, headers...).Status]++
	}
	return got
}

// digestSecret is the key_digest_secret of the tests that check key
// digests in statistics, logs and events.
const digestSecret = "test-digest-secret"

// keyDigest returns a key's digest under digestSecret.
func keyDigest(key string) string {
	return limiter.NewDigester([]byte(digestSecret)).Digest(key)
}
