package rls

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// xdsNode is the node ID the tests' service presents, Envoy Gateway's.
const xdsNode = "envoy-ratelimit"

// managementServer is go-control-plane's own state-of-the-world server,
// serving ADS from a snapshot cache on a loopback port, as Envoy Gateway
// serves its rate limit service, and recording what the client answers.
type managementServer struct {
	t     *testing.T
	addr  string
	cache cachev3.SnapshotCache
	grpc  *grpc.Server

	mu       sync.Mutex
	requests []*discoveryv3.DiscoveryRequest
	versions map[string]string // the version of each response, by nonce
}

// startManagementServer serves on addr ("127.0.0.1:0" for any port) until
// stopped or the test ends; opts are the gRPC server's (TLS).
func startManagementServer(t *testing.T, addr string, opts ...grpc.ServerOption) *managementServer {
	t.Helper()
	m := &managementServer{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), versions: map[string]string{}}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	m.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	callbacks := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			m.mu.Lock()
			m.requests = append(m.requests, req)
			m.mu.Unlock()
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			m.mu.Lock()
			m.versions[resp.GetNonce()] = resp.GetVersionInfo()
			m.mu.Unlock()
		},
	}
	m.grpc = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(m.grpc, serverv3.NewServer(ctx, m.cache, callbacks))
	go func() { _ = m.grpc.Serve(ln) }()
	t.Cleanup(func() { m.stop(); cancel() })
	return m
}

// stop stops the server at once, its streams broken.
func (m *managementServer) stop() { m.grpc.Stop() }

// set makes resources the node's snapshot of version.
func (m *managementServer) set(version string, resources ...*rlsconf.RateLimitConfig) {
	m.t.Helper()
	list := make([]types.Resource, len(resources))
	for i, r := range resources {
		list[i] = r
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: list})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.cache.SetSnapshot(context.Background(), xdsNode, snap); err != nil {
		m.t.Fatal(err)
	}
}

// answer waits until the client has answered the response of version
// (by its nonce): an ACK (it names the version, no error) or a NACK (an
// error detail), which it returns.
func (m *managementServer) answer(version string, nack bool) *discoveryv3.DiscoveryRequest {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m.mu.Lock()
		for _, req := range m.requests {
			if v, ok := m.versions[req.GetResponseNonce()]; !ok || v != version || req.GetNode().GetId() != xdsNode {
				continue
			}
			if !nack && req.GetErrorDetail() == nil && req.GetVersionInfo() == version || nack && req.GetErrorDetail() != nil {
				m.mu.Unlock()
				return req
			}
		}
		m.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	m.t.Fatalf("no %s of version %q within 10s", map[bool]string{false: "ACK", true: "NACK"}[nack], version)
	return nil
}

// meshLimit is a resource of domain mesh with one rule: a user's calls,
// n per hour.
func meshLimit(n uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "mesh-rules", Domain: "mesh", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: n}},
	}}
}

// xdsApp starts the app subscribed to the management server at addr.
func xdsApp(t *testing.T, addr string, tls *XDSTLS) *App {
	return startApp(t, nil, func(a *App) {
		a.ConfigDir = ""
		a.XDS = &XDS{Address: addr, NodeID: xdsNode, TLS: tls,
			BackoffInitial: caddy.Duration(20 * time.Millisecond), BackoffMax: caddy.Duration(100 * time.Millisecond)}
	})
}

// subscribed starts a management server whose version 1 is mesh's rule
// of limit per hour, and the app subscribed to it, and returns the server
// and an emulator of the app once that rule decides.
func subscribed(t *testing.T, limit uint32) (*managementServer, *envoy) {
	t.Helper()
	m := startManagementServer(t, "127.0.0.1:0")
	m.set("1", meshLimit(limit))
	e := patientEnvoy(t, xdsApp(t, m.addr, nil).addr(0))
	waitLimit(t, e, limit)
	return m, e
}

// limitOf returns the limit per hour that decides a user's call to mesh,
// without charging it; 0 when no rule does.
func limitOf(e *envoy, user string) uint32 {
	return e.must("mesh", hits(desc("user", user), 0)).Statuses[0].CurrentLimit.GetRequestsPerUnit()
}

// waitLimit waits until mesh's rule is want per hour.
func waitLimit(t *testing.T, e *envoy, want uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for limitOf(e, "probe") != want {
		if time.Now().After(deadline) {
			t.Fatalf("the rule is %d per hour 10s on, want %d", limitOf(e, "probe"), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestXDSSubscription runs the service on go-control-plane's own SotW
// server: a snapshot's rules decide, the next snapshot replaces them, a
// bad one is NACKed with the resource and the fault while the old rules
// go on deciding, and a server that restarts (counting its versions anew)
// is found again.
func TestXDSSubscription(t *testing.T) {
	m, e := subscribed(t, 2)
	if ack := m.answer("1", false); ack.GetTypeUrl() != resource.RateLimitConfigType {
		t.Fatalf("ACK of type %q", ack.GetTypeUrl())
	}
	// The snapshot limits: two calls, and the third is over.
	for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		if got := answerCodes(e.must("mesh", desc("user", "ann"))); got != want {
			t.Fatalf("call %d: %s, want %s", i, got, want)
		}
	}

	// An update replaces the rules: a new domain, mesh's rule raised.
	edge := &rlsconf.RateLimitConfig{Name: "edge-rules", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 1}},
	}}
	m.set("2", meshLimit(5), edge)
	waitLimit(t, e, 5)
	m.answer("2", false)
	if got := answerCodes(e.must("edge", desc("remote_address", "192.0.2.1"), desc("remote_address", "192.0.2.1"))); got != "OVER_LIMIT: OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("two calls' worth against edge's 1 per minute: %s", got)
	}

	// Bad updates are NACKed, each naming the resource and the fault, and
	// the rules of version 2 go on deciding.
	for _, c := range []struct {
		version string
		bad     *rlsconf.RateLimitConfig
		want    string
	}{
		{"3", &rlsconf.RateLimitConfig{Name: "broken", Domain: "other", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_DAY}},
		}}, `rate limit config "broken": descriptors[0].rate_limit.unit: an unlimited rule takes no unit`},
		// Two resources of one domain.
		{"4", &rlsconf.RateLimitConfig{Name: "again", Domain: "mesh"},
			`rate limit config "mesh-rules": duplicate domain "mesh" (first defined at rate limit config "again")`},
	} {
		m.set(c.version, meshLimit(7), c.bad)
		nack := m.answer(c.version, true)
		if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, c.want) {
			t.Errorf("version %s NACKed with %q, want it to say %q", c.version, msg, c.want)
		}
		if nack.GetVersionInfo() != "2" {
			t.Errorf("the NACK of version %s names version %q as applied, want 2", c.version, nack.GetVersionInfo())
		}
		if got := limitOf(e, "bob"); got != 5 {
			t.Fatalf("after NACK of version %s the rule is %d per hour, want version 2's 5", c.version, got)
		}
	}

	// The server goes away: the last good rules decide meanwhile. It comes
	// back on the same address with a new cache whose versions start again
	// at 1, and its rules take over.
	m.stop()
	time.Sleep(100 * time.Millisecond) // a few failed attempts to reconnect
	if got := limitOf(e, "bob"); got != 5 {
		t.Fatalf("with the server away the rule is %d per hour, want 5", got)
	}
	back := startManagementServer(t, m.addr)
	back.set("1", meshLimit(9))
	waitLimit(t, e, 9)
	back.answer("1", false)
}

// TestXDSRefusalPaced: go-control-plane's snapshot cache sends a refused
// version again as soon as it is NACKed; the service answers the repeats
// at most once per backoff_initial (20ms here), not in a busy loop (it
// was 2,133 NACKs a second), and takes the fixed version that follows.
func TestXDSRefusalPaced(t *testing.T) {
	m, e := subscribed(t, 2)
	m.set("2", &rlsconf.RateLimitConfig{Name: "broken"})
	m.answer("2", true)
	time.Sleep(time.Second)
	m.mu.Lock()
	nacks := 0
	for _, req := range m.requests {
		if req.GetErrorDetail() != nil {
			nacks++
		}
	}
	m.mu.Unlock()
	if nacks > 1+1000/20+2 {
		t.Errorf("%d NACKs of one version in a second, want at most one per 20ms", nacks)
	}
	m.set("3", meshLimit(6))
	waitLimit(t, e, 6)
}

// TestXDSAcrossReload: a new configuration of the app starts with the
// rules the previous one received, even while the management server is
// away, so that a reload does not lift the limits.
func TestXDSAcrossReload(t *testing.T) {
	m := startManagementServer(t, "127.0.0.1:0")
	m.set("1", meshLimit(3))
	old := xdsApp(t, m.addr, nil)
	waitLimit(t, patientEnvoy(t, old.addr(0)), 3)
	m.stop()
	next := xdsApp(t, m.addr, nil)
	_ = old.Stop()
	if got := limitOf(patientEnvoy(t, next.addr(0)), "ann"); got != 3 {
		t.Fatalf("the new configuration starts with a rule of %d per hour, want the received 3", got)
	}
}

// TestXDSMutualTLS subscribes over mutual TLS, as Envoy Gateway serves:
// the server verifies the service's client certificate, the service the
// server's.
func TestXDSMutualTLS(t *testing.T) {
	files := redistest.GenerateTLS(t)
	serverTLS, err := (&TLS{CertFile: files.CertFile, KeyFile: files.KeyFile, ClientCAFile: files.CAFile}).config()
	if err != nil {
		t.Fatal(err)
	}
	m := startManagementServer(t, "127.0.0.1:0", grpc.Creds(credentials.NewTLS(serverTLS)))
	m.set("1", meshLimit(4))
	a := xdsApp(t, m.addr, &XDSTLS{CertFile: files.ClientCertFile, KeyFile: files.ClientKeyFile,
		CAFile: files.CAFile, ServerName: files.ServerName})
	waitLimit(t, patientEnvoy(t, a.addr(0)), 4)
	m.answer("1", false)
}
