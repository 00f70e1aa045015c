package tests

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestRLSXDSCaddy: a Caddy process built from cmd/caddy takes its rules
// from go-control-plane's own state-of-the-world server, as Envoy Gateway
// feeds its rate limit service: a snapshot's rule limits the calls, and
// the next snapshot replaces it without a reload.
func TestRLSXDSCaddy(t *testing.T) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	setLimit := func(version string, n uint32) {
		t.Helper()
		snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {
			&rlsconf.RateLimitConfig{Name: "edge-rules", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: n}},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
			t.Fatal(err)
		}
	}
	setLimit("1", 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	xds := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(xds, serverv3.NewServer(ctx, cache, nil))
	go func() { _ = xds.Serve(ln) }()
	t.Cleanup(func() { xds.Stop(); cancel() })

	port := redistest.FreePort(t)
	startCaddy(t, fmt.Sprintf(`	rate_limit_rls {
		listen 127.0.0.1:%d
		xds {
			address %s
			node_id envoy-ratelimit
		}
	}`, port, ln.Addr()), `respond "ok"`)
	client := rlsClient(t, port)
	// The rule in force, without charging it (0 hits); 0 before any.
	limit := func() uint32 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 0,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "probe"}},
				HitsAddend: wrapperspb.UInt64(0),
			}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	waitFor := func(want uint32) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for limit() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the rule is %d per hour 15s on, want %d", limit(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(2)
	for i, want := range []string{"OK", "OK", "OVER_LIMIT"} {
		resp, err := rlsCall(client, 10*time.Second, "192.0.2.1")
		if err != nil || resp.OverallCode.String() != want {
			t.Fatalf("call %d: %v %v, want %s", i, resp.GetOverallCode(), err, want)
		}
	}
	setLimit("2", 50)
	waitFor(50)
	if resp, err := rlsCall(client, 10*time.Second, "192.0.2.1"); err != nil || resp.OverallCode.String() != "OK" {
		t.Fatalf("under the new rule: %v %v, want OK", resp.GetOverallCode(), err)
	}
}
