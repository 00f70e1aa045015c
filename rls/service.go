package rls

import (
	"context"
	"sync"
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// service answers ShouldRateLimit from the rules of one configuration
// directory, replaced when its files change (see watcher).
type service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rules   atomic.Pointer[rules]
	limiter *limiter.Limiter
	bounds  bounds
	logger  *zap.Logger
}

// newService returns the service of rules, deciding through l.
func newService(rs *rules, l *limiter.Limiter, b bounds, log *zap.Logger) *service {
	s := &service{limiter: l, bounds: b, logger: log}
	s.rules.Store(rs)
	return s
}

// callPool recycles the scratch space of calls.
var callPool = sync.Pool{New: func() any { return new(call) }}

// ShouldRateLimit decides every descriptor of the request in one decision
// of the limiter: OVER_LIMIT when any rule denies (or, in quota mode, all
// the request's quota rules do), and then no descriptor is charged. A
// bad request is refused with INVALID_ARGUMENT and charges nothing. The
// decision ends before the caller's deadline: when the store has not
// answered by then, each rule's on_error policy answers; a call whose
// caller has gone gets the context's status, not an answer.
func (s *service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.bounds.check(req); err != nil {
		return nil, err
	}
	rs := s.rules.Load()
	if !rs.cfg.HasDomain(req.GetDomain()) {
		return unmatched(len(req.GetDescriptors())), nil // as the reference: no rule, OK
	}
	c := callPool.Get().(*call)
	defer c.release()
	if err := c.plan(rs, req); err != nil {
		return nil, err
	}
	dctx, cancel := decisionContext(ctx)
	resp := c.decide(dctx, s.limiter, rs.obs)
	cancel()
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return resp, nil
}

// unmatched is the answer to n descriptors that no rule applies to.
func unmatched(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return resp
}

// entriesOf appends a descriptor's entries to dst.
func entriesOf(dst []config.Entry, d *ratelimitv3.RateLimitDescriptor) []config.Entry {
	for _, e := range d.GetEntries() {
		dst = append(dst, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return dst
}

// overrideError is the status of a descriptor whose own limit is invalid.
func overrideError(i int, err error) error {
	return status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
}
