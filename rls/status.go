package rls

import (
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// answer builds the response: one status per descriptor, in the request's
// order, and OVER_LIMIT overall when any status is (never UNKNOWN, on
// which Envoy asserts).
func (c *call) answer(out limiter.Outcome) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.items))}
	for i, it := range c.items {
		st := c.status(it)
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
	}
	return resp
}

// status is one descriptor's status, as the reference reports it:
//   - no rule: OK and nothing else;
//   - an unlimited rule: OK with limit_remaining the largest uint32;
//   - a rule over its limit: OVER_LIMIT, limit_remaining 0, and the time
//     until a request can pass again; in shadow or quota mode OK instead
//     (see call.quotaOver for when it denies);
//   - a rule within its limit: OK, what remains (after this call's
//     charge, when the call was admitted) and the time until the bucket
//     is full again (a fixed window: until it ends);
//   - a rule the store could not decide (on_error allow, or a rule that
//     another's policy answered for): OK with limit_remaining 0.
func (c *call) status(it item) *rlsv3.RateLimitResponse_DescriptorStatus {
	switch {
	case it.rule == nil:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	case it.rule.limit.Unlimited:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
	case it.rule.never():
		if it.rule.soft() {
			return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: it.rule.current}
		}
		return c.overStatus(it)
	case it.req < 0 || it.req >= len(c.results):
		// Not decided: a rule that admits nothing denied the call first.
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: it.rule.current}
	}
	res := &c.results[it.req]
	switch {
	case !res.Allowed:
		return c.overStatus(it)
	case res.Unknown:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: it.rule.current}
	case res.DryRun:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: it.rule.current,
			DurationUntilReset: durationpb.New(untilPass(it, res))}
	}
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OK,
		CurrentLimit:       it.rule.current,
		LimitRemaining:     uint32(min(max(res.Remaining, 0), math.MaxUint32)),
		DurationUntilReset: durationpb.New(untilReset(it, res)),
	}
}

// overStatus is the status of a descriptor over its limit.
func (c *call) overStatus(it item) *rlsv3.RateLimitResponse_DescriptorStatus {
	var res *limiter.Result
	if it.req >= 0 && it.req < len(c.results) {
		res = &c.results[it.req]
	}
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
		CurrentLimit:       it.rule.current,
		DurationUntilReset: durationpb.New(untilPass(it, res)),
	}
}

// untilPass is how long until a descriptor over its limit can pass: the
// limiter's RetryAfter, or, where it has none (never, or not decided), the
// rest of the rule's current window as the reference reports it.
func untilPass(it item, res *limiter.Result) time.Duration {
	if res != nil && res.RetryAfter > 0 {
		return res.RetryAfter
	}
	return windowLeft(it, time.Now())
}

// untilReset is how long until a descriptor's bucket is full again; for a
// fixed window that counts nothing yet, the rest of the window, as the
// reference reports it.
func untilReset(it item, res *limiter.Result) time.Duration {
	if res.ResetAfter > 0 || it.rule.lim.Algorithm() != limiter.FixedWindow {
		return res.ResetAfter
	}
	return windowLeft(it, time.Now())
}

// windowLeft is what is left at now of the rule's fixed window (one
// unit, or a zone's period), the windows starting at its multiples since
// the Unix epoch (this node's clock: the store's is not at hand).
func windowLeft(it item, now time.Time) time.Duration {
	w := it.rule.limit.Unit.Duration()
	if it.rule.lim != nil {
		w = it.rule.lim.Per()
	}
	if w <= 0 {
		return 0
	}
	return w - time.Duration(now.UnixNano())%w
}
