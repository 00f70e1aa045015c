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
	resp, space := newAnswer(len(c.items))
	for i, it := range c.items {
		st := c.status(it, &space[i])
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
	}
	return resp
}

// statusSpace is the memory of one descriptor's status.
type statusSpace struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	until  durationpb.Duration // its duration_until_reset, when it has one
}

// oneAnswer is the memory of an answer of one descriptor (Envoy's usual
// call), taken in one allocation rather than four.
type oneAnswer struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	space    [1]statusSpace
}

// newAnswer returns an OK response with room for n statuses, and the
// space to build them in.
func newAnswer(n int) (*rlsv3.RateLimitResponse, []statusSpace) {
	if n == 1 {
		a := new(oneAnswer)
		a.resp.OverallCode = rlsv3.RateLimitResponse_OK
		a.resp.Statuses = a.statuses[:]
		return &a.resp, a.space[:]
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	return resp, make([]statusSpace, n)
}

// duration returns d as sp's duration_until_reset, as durationpb.New
// makes it.
func (sp *statusSpace) duration(d time.Duration) *durationpb.Duration {
	n := d.Nanoseconds()
	sp.until.Seconds, sp.until.Nanos = n/1e9, int32(n%1e9)
	return &sp.until
}

// status is one descriptor's status, built in sp, as the reference
// reports it:
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
func (c *call) status(it item, sp *statusSpace) *rlsv3.RateLimitResponse_DescriptorStatus {
	const ok = rlsv3.RateLimitResponse_OK
	st := &sp.status
	switch {
	case it.rule == nil:
		*st = rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}
		return st
	case it.rule.limit.Unlimited:
		*st = rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: math.MaxUint32}
		return st
	case it.rule.never():
		if it.rule.soft() {
			*st = rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, CurrentLimit: it.rule.current}
			return st
		}
		return c.overStatus(it, sp)
	case it.req < 0 || it.req >= len(c.results):
		// Not decided: a rule that admits nothing denied the call first.
		*st = rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, CurrentLimit: it.rule.current}
		return st
	}
	res := &c.results[it.req]
	switch {
	case !res.Allowed:
		return c.overStatus(it, sp)
	case res.Unknown:
		*st = rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, CurrentLimit: it.rule.current}
	case res.DryRun:
		*st = rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, CurrentLimit: it.rule.current,
			DurationUntilReset: sp.duration(untilPass(it, res))}
	default:
		*st = rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               ok,
			CurrentLimit:       it.rule.current,
			LimitRemaining:     uint32(min(max(res.Remaining, 0), math.MaxUint32)),
			DurationUntilReset: sp.duration(untilReset(it, res)),
		}
	}
	return st
}

// overStatus is the status of a descriptor over its limit, built in sp.
func (c *call) overStatus(it item, sp *statusSpace) *rlsv3.RateLimitResponse_DescriptorStatus {
	var res *limiter.Result
	if it.req >= 0 && it.req < len(c.results) {
		res = &c.results[it.req]
	}
	sp.status = rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
		CurrentLimit:       it.rule.current,
		DurationUntilReset: sp.duration(untilPass(it, res)),
	}
	return &sp.status
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
