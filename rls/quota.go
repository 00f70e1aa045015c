package rls

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Quota mode, as the reference has it since its release of February 2026:
// a quota rule's denial alone denies nothing (its status reads OK), but a
// request whose quota rules are all over is over the limit. The limiter
// decides quota rules as dry runs (counted, never denying), so the
// service sees which are over once the store has decided; when all are,
// the request is over the limit after all, and what the store charged the
// other rules is given back (all-or-nothing: a denied request is charged
// to none).

// quotaOver reports whether the call has quota rules and all of them are
// over their limit (would have denied, or admit nothing).
func (c *call) quotaOver() bool {
	quotas := 0
	for _, it := range c.items {
		if it.rule == nil || !isQuota(it.rule) {
			continue
		}
		quotas++
		if !it.rule.never() && (it.req < 0 || !c.results[it.req].DryRun) {
			return false
		}
	}
	return quotas > 0
}

// isQuota reports whether r is a quota rule (shadow mode wins over quota
// mode, as in the reference: a shadow rule never counts as over).
func isQuota(r *rule) bool { return r.limit.QuotaMode && !r.limit.ShadowMode && !r.limit.Unlimited }

// answerQuotaOver answers a call whose quota rules are all over: they
// read OVER_LIMIT, the others what they would have been without the charge
// that was given back.
func (c *call) answerQuotaOver() *rlsv3.RateLimitResponse {
	resp := c.answer(limiter.Denied)
	for i, it := range c.items {
		if it.rule != nil && isQuota(it.rule) {
			resp.Statuses[i] = c.overStatus(it, new(statusSpace))
		}
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	return resp
}

// refundCharged gives back, in the background, what an admitted decision
// charged: the call is over its quota after all.
func (c *call) refundCharged(ctx context.Context, l *limiter.Limiter, out limiter.Outcome) {
	var reqs []limiter.Request
	var results []limiter.Result
	for j := range c.reqs {
		if c.reqs[j].Cost > 0 && !c.results[j].DryRun && !c.results[j].Unknown {
			reqs, results = append(reqs, c.reqs[j]), append(results, c.results[j])
			c.results[j].Remaining += c.reqs[j].Cost // as it reads without the charge
		}
	}
	refund(ctx, l, out, reqs, results)
}

// refundNegativeHits refunds, in the background, the hits of the descriptors
// with is_negative_hits, once the call is admitted.
func (c *call) refundNegativeHits(ctx context.Context, l *limiter.Limiter, out limiter.Outcome) {
	if len(c.gives) == 0 {
		return
	}
	reqs := make([]limiter.Request, 0, len(c.gives))
	results := make([]limiter.Result, 0, len(c.gives))
	for _, g := range c.gives {
		if c.results[g.req].Unknown {
			continue // not decided by the store: nothing to give back to
		}
		q := c.reqs[g.req]
		q.Cost = g.hits
		reqs, results = append(reqs, q), append(results, c.results[g.req])
	}
	refund(ctx, l, out, reqs, results)
}

// refund gives back reqs' costs without holding up the answer (the
// caller's deadline does not bound it; the store's timeout does).
func refund(ctx context.Context, l *limiter.Limiter, out limiter.Outcome, reqs []limiter.Request, results []limiter.Result) {
	if len(reqs) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() { _ = l.Refund(ctx, out, reqs, results) }()
}
