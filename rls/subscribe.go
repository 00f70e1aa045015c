package rls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// rateLimitConfigType is the type URL of the resources the service
// subscribes to (go-control-plane's resource.RateLimitConfigType).
const rateLimitConfigType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// subscription keeps the rules of an xDS management server: one ADS
// stream at a time, opened again with backoff when it ends. Each update
// is applied whole or refused: ACK or NACK, as the protocol has it.
type subscription struct {
	xds    *XDS
	node   *corev3.Node
	creds  credentials.TransportCredentials
	apply  func(*config.Config) error // compiles and publishes the rules
	last   *lastXDS
	logger *zap.Logger

	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan struct{}
}

// newSubscription prepares a subscription to x (its TLS files read); it
// connects in start.
func newSubscription(x *XDS, apply func(*config.Config) error, last *lastXDS, log *zap.Logger) (*subscription, error) {
	creds := insecure.NewCredentials()
	if x.TLS != nil {
		cfg, err := x.TLS.config()
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		creds = credentials.NewTLS(cfg)
	}
	return &subscription{xds: x, node: &corev3.Node{Id: x.nodeID()}, creds: creds,
		apply: apply, last: last, logger: log}, nil
}

// start connects and keeps the stream open until close.
func (s *subscription) start() error {
	initial, longest := s.xds.backoff()
	conn, err := grpc.NewClient(s.xds.Address, grpc.WithTransportCredentials(s.creds),
		// gRPC's own reconnection waits as the subscription does, not up
		// to its default two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: initial, Multiplier: 2, Jitter: 0.2, MaxDelay: longest},
			MinConnectTimeout: 10 * time.Second,
		}))
	if err != nil {
		return fmt.Errorf("xds address %q: %w", s.xds.Address, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.conn, s.cancel, s.done = conn, cancel, make(chan struct{})
	go s.run(ctx)
	return nil
}

// close ends the stream and waits until the subscription has stopped.
func (s *subscription) close() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	_ = s.conn.Close()
	s.cancel = nil
}

// run opens the stream again and again, with backoff, until ctx ends.
func (s *subscription) run(ctx context.Context) {
	defer close(s.done)
	initial, longest := s.xds.backoff()
	wait := initial
	for {
		updated, err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if updated {
			wait = initial
		}
		// Up to half again at random, so that a fleet does not come back
		// to a restarted server all at once.
		pause := wait + rand.N(wait/2+1)
		s.logger.Warn("rate limit service: xDS stream ended; the last rules received go on deciding",
			zap.String("address", s.xds.Address), zap.Error(err), zap.Duration("retry_in", pause))
		if !sleep(ctx, pause) {
			return
		}
		wait = min(wait*2, longest)
	}
}

// stream subscribes on one ADS stream until it fails, answering each
// update with an ACK or a NACK. It reports whether any update came.
func (s *subscription) stream(ctx context.Context) (updated bool, err error) {
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(s.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	// No version: the server answers its whole current state on every
	// new stream, even when it restarted and counts its versions anew.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: rateLimitConfigType}); err != nil {
		return false, err
	}
	pace, _ := s.xds.backoff()
	accepted := ""      // the version of this stream's last good update
	var refused *string // the version this stream refused last, if any
	for {
		resp, err := st.Recv()
		if err != nil {
			return updated, err
		}
		updated = true
		next := &discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: rateLimitConfigType, ResponseNonce: resp.GetNonce()}
		if err := s.accept(resp); err != nil {
			version := resp.GetVersionInfo()
			if refused != nil && *refused == version {
				// A server that sends a refused version again as soon as
				// it is refused (go-control-plane's snapshot cache does)
				// gets its NACKs paced, not a busy loop; a new version
				// is answered at the next of them.
				if !sleep(ctx, pace) {
					return updated, ctx.Err()
				}
			} else {
				s.logger.Error("rate limit service: xDS update refused (NACK); the previous rules stay",
					zap.String("version", version), zap.Error(err))
			}
			refused = &version
			next.VersionInfo = accepted
			next.ErrorDetail = status.New(codes.InvalidArgument, err.Error()).Proto()
		} else {
			refused = nil
			accepted = resp.GetVersionInfo()
			next.VersionInfo = accepted
		}
		if err := st.Send(next); err != nil {
			return updated, err
		}
	}
}

// sleep waits for d, or less if ctx ends first; it reports whether it
// waited the whole time.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// accept loads and applies the resources of an update, or says why it
// cannot, naming the resource.
func (s *subscription) accept(resp *discoveryv3.DiscoveryResponse) error {
	if resp.GetTypeUrl() != rateLimitConfigType {
		return fmt.Errorf("type %q: the service subscribes to %s only", resp.GetTypeUrl(), rateLimitConfigType)
	}
	resources := make([]*rlsconf.RateLimitConfig, 0, len(resp.GetResources()))
	for i, res := range resp.GetResources() {
		rc := new(rlsconf.RateLimitConfig)
		if err := res.UnmarshalTo(rc); err != nil {
			return fmt.Errorf("resource #%d (%s): %w", i, res.GetTypeUrl(), err)
		}
		resources = append(resources, rc)
	}
	cfg, err := config.FromXDS(resources)
	if err != nil {
		return err
	}
	if err := s.apply(cfg); err != nil {
		return err
	}
	s.last.set(cfg)
	s.logger.Info("rate limit service rules received over xDS", zap.String("version", resp.GetVersionInfo()),
		zap.Strings("domains", cfg.Domains()), zap.Int("rules", len(cfg.Limits())))
	return nil
}

// lastXDSPool keeps, for each management server and node, the last rules
// it sent, across config reloads: the new configuration's app decides with
// them from its first call, before its own stream has an answer, and while
// the server is away.
var lastXDSPool = caddy.NewUsagePool()

// lastXDS holds the last good rules of one management server and node.
type lastXDS struct {
	mu  sync.Mutex
	cfg *config.Config
}

// lastXDSKey is the pool key of a subscription's last rules.
func lastXDSKey(x *XDS) string { return x.Address + "\x00" + x.nodeID() }

// get returns the last good rules, nil before any.
func (l *lastXDS) get() *config.Config {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg
}

// set records good rules.
func (l *lastXDS) set(cfg *config.Config) {
	l.mu.Lock()
	l.cfg = cfg
	l.mu.Unlock()
}

// Destruct lets the last user's rules go.
func (l *lastXDS) Destruct() error { return nil }
