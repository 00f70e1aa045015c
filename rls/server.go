package rls

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/caddyserver/caddy/v2"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// maxMessageBytes is the largest call the servers read: far above any
// real one (MaxDescriptors descriptors of MaxEntries short entries), so
// that a call carrying megabytes is refused by gRPC itself
// (RESOURCE_EXHAUSTED) before it is decoded.
const maxMessageBytes = 1 << 20

// serviceName is the name the health service reports the rate limit
// service under (and "" for the server as a whole).
const serviceName = "envoy.service.ratelimit.v3.RateLimitService"

// streamWorkers is how many goroutines of a server answer calls, each one
// call after another, so that a call runs on a stack that earlier calls
// have grown rather than on a new goroutine's, which grows its stack on
// every call (a tenth of the service's CPU). A call that finds them all
// busy gets a goroutine of its own, as without them.
const streamWorkers = 64

// listenAddress is one address to serve on, and whether it serves TLS.
type listenAddress struct {
	addr caddy.NetworkAddress
	tls  bool
}

// server is one gRPC server on one listener.
type server struct {
	grpc   *grpc.Server
	health *health.Server
	ln     net.Listener
	done   chan struct{} // closed when Serve returned
	logger *zap.Logger
}

// addresses parses Listen and TLS.Listen (one port each), with Listen's
// default when neither gives any.
func (a *App) addresses() ([]listenAddress, error) {
	plain := a.Listen
	var secure []string
	if a.TLS != nil {
		secure = a.TLS.Listen
	}
	if len(plain) == 0 && len(secure) == 0 {
		plain = []string{":8081"}
	}
	var out []listenAddress
	for i, list := range [][]string{plain, secure} {
		for _, s := range list {
			na, err := caddy.ParseNetworkAddressWithDefaults(s, "tcp", 8081)
			if err != nil {
				return nil, fmt.Errorf("listen %q: %w", s, err)
			}
			if na.PortRangeSize() != 1 {
				return nil, fmt.Errorf("listen %q: give one port, not a range", s)
			}
			out = append(out, listenAddress{addr: na, tls: i == 1})
		}
	}
	return out, nil
}

// startServer listens on addr (through Caddy's listener pool, so that a
// reload's new server binds the port while the old one still serves it)
// and serves the rate limit and health services there.
func (a *App) startServer(la listenAddress) (*server, error) {
	ln, err := la.addr.Listen(context.Background(), 0, net.ListenConfig{})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", la.addr, err)
	}
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxMessageBytes), grpc.NumStreamWorkers(streamWorkers)}
	if la.tls {
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.tlsConfig)))
	}
	s := &server{
		grpc:   grpc.NewServer(opts...),
		health: health.NewServer(),
		ln:     ln.(net.Listener),
		done:   make(chan struct{}),
		logger: a.logger,
	}
	rlsv3.RegisterRateLimitServiceServer(s.grpc, a.service)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus(serviceName, healthpb.HealthCheckResponse_SERVING)
	go s.serve()
	a.logger.Info("rate limit service listening", zap.String("address", s.ln.Addr().String()), zap.Bool("tls", la.tls))
	return s, nil
}

// serve serves until the server stops.
func (s *server) serve() {
	defer close(s.done)
	if err := s.grpc.Serve(s.ln); err != nil {
		s.logger.Error("rate limit service stopped serving", zap.Error(err))
	}
}

// stop reports the server NOT_SERVING, stops it gracefully (no new
// calls; those in flight are answered) and, after grace, closes what is
// left.
func (s *server) stop(grace time.Duration) {
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		s.logger.Warn("rate limit service: calls still in flight after the grace period; closing their connections",
			zap.String("address", s.ln.Addr().String()), zap.Duration("grace_period", grace))
		s.grpc.Stop()
		<-stopped
	}
	<-s.done
}
