package rls

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// call is one ShouldRateLimit call on its way to an answer: the rule of
// each descriptor, and the limiter requests they make.
type call struct {
	req     *rlsv3.RateLimitRequest
	limits  []*config.Limit // per descriptor: its limit, nil for none
	items   []item          // per descriptor
	reqs    []limiter.Request
	results []limiter.Result
	// gives are the requests whose hits are given back (is_negative_hits):
	// decided with cost 0, and refunded the hits after.
	gives   []give
	entries []config.Entry
	key     [256]byte
	// ozones, oreqs and ores are the zones, requests and results that
	// call.record passes on.
	ozones []*observe.Zone
	oreqs  []limiter.Request
	ores   []limiter.Result
	// mkeys holds, per request, the metric key of a rule with
	// detailed_metric or value_to_metric ("" for the others), and onames
	// the zone name of a request's own limit ("" for the others).
	mkeys  []string
	onames []string
}

// item is one descriptor's part of the call.
type item struct {
	rule *rule // nil: no rule applies
	// hits is what the descriptor charges (0: it only looks), or gives
	// back with is_negative_hits.
	hits int64
	// req is the descriptor's request in reqs, -1 for none (no rule, an
	// unlimited rule, or one that admits nothing).
	req int
}

// give is a request whose hits are given back.
type give struct {
	req  int
	hits int64
}

// release returns c to the pool, dropping what it refers to.
func (c *call) release() {
	clear(c.limits)
	clear(c.items)
	clear(c.reqs)
	clear(c.entries)
	clear(c.ozones)
	clear(c.oreqs)
	clear(c.mkeys)
	clear(c.onames)
	*c = call{limits: c.limits[:0], items: c.items[:0], reqs: c.reqs[:0], results: c.results[:0],
		gives: c.gives[:0], entries: c.entries[:0], ozones: c.ozones[:0], oreqs: c.oreqs[:0], ores: c.ores[:0],
		mkeys: c.mkeys[:0], onames: c.onames[:0]}
	callPool.Put(c)
}

// plan finds each descriptor's rule (its own limit, else the
// configuration's), drops the rules that others replace, and makes the
// limiter requests: one per bucket, descriptors on the same bucket
// sharing it.
func (c *call) plan(rs *rules, req *rlsv3.RateLimitRequest) error {
	c.req = req
	for i, d := range req.Descriptors {
		c.entries = entriesOf(c.entries[:0], d)
		var l *config.Limit
		if o := d.GetLimit(); o != nil {
			var err error
			if l, err = rs.cfg.Override(req.Domain, c.entries, o.GetRequestsPerUnit(), config.Unit(o.GetUnit())); err != nil {
				return overrideError(i, err)
			}
		} else {
			l = rs.cfg.Match(req.Domain, c.entries)
		}
		c.limits = append(c.limits, l)
	}
	config.DropReplaced(c.limits)
	for i, l := range c.limits {
		it := item{req: -1, hits: hitsOf(req, i)}
		if l != nil {
			r, err := rs.ruleOf(l)
			if err != nil {
				return overrideError(i, err)
			}
			it.rule = r
			if r.lim != nil {
				c.entries = entriesOf(c.entries[:0], req.Descriptors[i])
				it.req = c.request(r, c.bucketKey(r, l), it.hits, req.Descriptors[i].GetIsNegativeHits())
				c.metricKey(l, it.req)
			}
		}
		c.items = append(c.items, it)
	}
	return nil
}

// bucketKey returns the key of the bucket that c.entries, which matched
// limit l, spend: for a rule with a zone, the zone's key of the last
// entry's value (the client: remote_address, say), else the entries'.
func (c *call) bucketKey(r *rule, l *config.Limit) string {
	if r.zoneKey != nil {
		return r.zoneKey(c.entries[len(c.entries)-1].Value)
	}
	return clientKey(l, c.entries, c.key[:0])
}

// ruleOf returns the compiled rule of a limit: the configuration's, or a
// request's own.
func (rs *rules) ruleOf(l *config.Limit) (*rule, error) {
	if l.Override {
		return rs.override(l)
	}
	return rs.of(l), nil
}

// request returns the index of the request for rule r's bucket of key,
// adding hits to it: descriptors on one bucket make one request, since two
// requests on one bucket in one decision would each be checked against
// the bucket as it was. Where their rules differ (a request's own limit
// beside the configuration's), the stricter decides. Hits to give back
// make a request of their own, which only looks.
func (c *call) request(r *rule, key string, hits int64, negative bool) int {
	if negative {
		c.reqs = append(c.reqs, limiter.Request{Rule: r.lim, Key: key})
		c.gives = append(c.gives, give{len(c.reqs) - 1, hits})
		return len(c.reqs) - 1
	}
	for j := range c.reqs {
		q := &c.reqs[j]
		if q.Key != key || q.Rule.Bucket() != r.lim.Bucket() || c.giving(j) {
			continue
		}
		q.Cost += hits
		if stricter(r.lim, q.Rule) {
			q.Rule = r.lim
		}
		return j
	}
	c.reqs = append(c.reqs, limiter.Request{Rule: r.lim, Key: key, Cost: hits})
	return len(c.reqs) - 1
}

// giving reports whether request j gives hits back.
func (c *call) giving(j int) bool {
	for _, g := range c.gives {
		if g.req == j {
			return true
		}
	}
	return false
}

// stricter reports whether rule a decides a shared bucket more strictly
// than b: enforced before a dry run, then the lower rate.
func stricter(a, b *limiter.Rule) bool {
	if a.DryRun() != b.DryRun() {
		return !a.DryRun()
	}
	return a.Rate() < b.Rate()
}

// decide decides the call's requests in one limiter decision (none when a
// rule that admits nothing already denies it), records it in obs (nil:
// nowhere) and answers.
func (c *call) decide(ctx context.Context, l *limiter.Limiter, obs *observed) *rlsv3.RateLimitResponse {
	if c.banned() {
		return c.answer(limiter.Denied)
	}
	if len(c.reqs) == 0 {
		return c.answer(limiter.Allowed)
	}
	c.results = append(c.results[:0], make([]limiter.Result, len(c.reqs))...)
	out := l.Decide(ctx, c.reqs, c.results)
	if out == limiter.Allowed || out == limiter.LocalAllowed {
		if c.quotaOver() {
			c.refundCharged(ctx, l, out)
			c.record(obs, limiter.Denied)
			return c.answerQuotaOver()
		}
		c.refundNegativeHits(ctx, l, out)
	}
	c.record(obs, out)
	return c.answer(out)
}

// banned reports whether an enforced rule of 0 requests per unit applies
// to a descriptor: the request is over the limit without asking the store.
func (c *call) banned() bool {
	for _, it := range c.items {
		if it.rule != nil && it.rule.never() && !it.rule.soft() {
			return true
		}
	}
	return false
}
