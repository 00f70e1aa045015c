package rls

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestHealth: the standard health service reports the server and the rate
// limit service SERVING, and NOT_SERVING once the app stops.
func TestHealth(t *testing.T) {
	a := startApp(t, map[string]string{"api.yaml": userConfig}, nil)
	e := newEnvoy(t, a.addr(0))
	health := healthpb.NewHealthClient(e.conn)
	for _, name := range []string{"", serviceName} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		cancel()
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v %v, want SERVING", name, resp, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	watch, err := health.Watch(ctx, &healthpb.HealthCheckRequest{Service: serviceName})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watching: %v %v", first, err)
	}
	stopped := make(chan struct{})
	go func() { _ = a.Stop(); close(stopped) }()
	if next, err := watch.Recv(); err == nil && next.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("stopping: %v, want NOT_SERVING (or the stream closed)", next.Status)
	}
	cancel() // a watch is a call in flight: the graceful stop waits for it
	<-stopped
}

// TestTLS serves TLS beside plaintext: a client that trusts the CA and
// presents a certificate it signed is answered; without a certificate, or
// in plaintext on the TLS port, it is not.
func TestTLS(t *testing.T) {
	files := redistest.GenerateTLS(t)
	a := startApp(t, map[string]string{"api.yaml": userConfig}, func(a *App) {
		a.TLS = &TLS{Listen: []string{"127.0.0.1:0"}, CertFile: files.CertFile, KeyFile: files.KeyFile, ClientCAFile: files.CAFile}
	})
	if len(a.servers) != 2 {
		t.Fatalf("%d servers, want plaintext and TLS", len(a.servers))
	}
	mutual, err := files.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvoy(t, a.addr(1), grpc.WithTransportCredentials(credentials.NewTLS(mutual)))
	e.timeout = 10 * time.Second
	if got := answerCodes(e.must("api", desc("user", "tls"))); got != "OK: OK" {
		t.Fatalf("over mutual TLS: %s", got)
	}
	if got := answerCodes(patientEnvoy(t, a.addr(0)).must("api", desc("user", "plain"))); got != "OK: OK" {
		t.Fatalf("in plaintext beside TLS: %s", got)
	}
	anonymous := mutual.Clone()
	anonymous.Certificates = nil
	for name, creds := range map[string]grpc.DialOption{
		"without a client certificate": grpc.WithTransportCredentials(credentials.NewTLS(anonymous)),
		"in plaintext on the TLS port": grpc.WithTransportCredentials(insecure.NewCredentials()),
	} {
		conn, err := grpc.NewClient(a.addr(1), creds)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "x")}})
		cancel()
		_ = conn.Close()
		if err == nil {
			t.Errorf("%s: answered", name)
		}
	}
}
