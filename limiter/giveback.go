package limiter

import (
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// Charges given back. A decision whose caller stopped waiting (the store's
// timeout) after its script call was sent is still run by Redis, late. Its
// request has taken its zones' failure policy by then (the local fallback
// decided it again, say), so what Redis charged it (tokens, a prefetching
// zone's spares, a window's count, a concurrency slot) belongs to no
// request: the pipeline worker that reads the late reply gives it back in
// a refund call, sent right after the batch.
//
// A reply that never comes (the connection broke: CLIENT KILL, a master
// that died in a failover, a read past twice MaxWait) leaves unknown
// whether Redis charged the request. Tokens then stay charged (strict);
// but a concurrency slot would be held for its whole lease by a request
// that is not running on Redis' account, so the worker releases the
// call's slots anyway: releasing a slot that was never taken removes
// nothing. A release that cannot reach Redis is tried again after later
// batches, until the slot's lease would have ended.

// giveBackCall returns the refund call that gives back what the abandoned
// decision c was charged, or nil when it was charged nothing (denied, or
// failed).
func (s *RedisStore) giveBackCall(c *call) *call {
	if c.script != s.script || c.err != nil || len(c.reply) != lua.ReplyLen(len(c.keys)) {
		return nil
	}
	at, _ := c.reply[0].(int64)
	if at <= 0 {
		return nil // denied: charged nothing
	}
	g := &call{script: s.refund, done: make(chan struct{}, 1)}
	var vals zoneReply
	for z, r := range c.rules {
		for j := range vals {
			vals[j], _ = c.reply[z*lua.ReplyZone+1+j].(int64)
		}
		v := r.fromReply(vals, 0)
		if !v.ok {
			continue // a dry-run zone that would have denied: not charged
		}
		var aux any = at // the time of the charge
		if r.alg == Concurrency {
			aux = c.aux[z] // the slot
		}
		g.keys = append(g.keys, c.keys[z])
		g.rules = append(g.rules, r)
		g.costs = append(g.costs, c.costs[z]+v.spares)
		g.aux = append(g.aux, aux)
	}
	if len(g.keys) == 0 {
		return nil
	}
	s.givenBack.Add(1)
	return g
}

// GivenBack returns how many abandoned decisions had their charges given
// back (see giveBackCall).
func (s *RedisStore) GivenBack() uint64 { return s.givenBack.Load() }

// releaseCall returns the refund call that releases the concurrency slots
// of the call c, whose reply was lost with its connection (see the top of
// this file): a decision that may have taken them, or a release (a
// request's end) that may not have reached Redis. It returns nil when c has
// no slot, got an answer, or is such a release tried again already.
func (s *RedisStore) releaseCall(c *call) *call {
	if c.err == nil || !lostReply(c.err) || !c.until.IsZero() {
		return nil
	}
	var g *call
	for z, r := range c.rules {
		if r.alg != Concurrency || c.costs[z] <= 0 {
			continue
		}
		if g == nil {
			g = &call{script: s.refund, done: make(chan struct{}, 1)}
		}
		g.keys = append(g.keys, c.keys[z])
		g.rules = append(g.rules, r)
		g.costs = append(g.costs, c.costs[z])
		g.aux = append(g.aux, c.aux[z])
		if until := time.Now().Add(r.Lease()); until.After(g.until) {
			g.until = until
		}
	}
	if g != nil {
		s.releasesSent.Add(1)
	}
	return g
}

// lostReply reports whether a call's error leaves unknown whether Redis ran
// it: any failure but Redis' own error reply (which it gives only for a
// script it did not run to the end, charging nothing: errors abort it
// before its writes).
func lostReply(err error) bool {
	var reply redis.Error
	var refused *requestError
	return !errors.As(err, &reply) && !errors.As(err, &refused)
}

// maxPendingReleases bounds the slot releases a store keeps to try again.
const maxPendingReleases = 4096

// pendingReleases are slot releases that could not reach Redis, kept to try
// again after later batches until their leases would have ended.
type pendingReleases struct {
	mu    sync.Mutex
	calls []*call
}

// waiting reports whether releases wait to be tried again.
func (p *pendingReleases) waiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls) > 0
}

// take returns the releases waiting, and forgets them.
func (p *pendingReleases) take() []*call {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.calls
	p.calls = nil
	return out
}

// keepUnsent keeps slot releases made while a round of releases ran (of
// its calls whose replies were lost), to send with the next round.
func (p *pendingReleases) keepUnsent(calls []*call) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range calls {
		if !c.until.IsZero() && len(p.calls) < maxPendingReleases {
			p.calls = append(p.calls, c)
		}
	}
}

// keepFailed keeps, of the calls just sent, the slot releases that could
// not reach Redis and whose leases have not ended at now, as fresh calls.
func (p *pendingReleases) keepFailed(sent []*call, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range sent {
		if c.until.IsZero() || c.err == nil || !lostReply(c.err) || !now.Before(c.until) || len(p.calls) >= maxPendingReleases {
			continue
		}
		again := &call{script: c.script, keys: c.keys, rules: c.rules, costs: c.costs, aux: c.aux,
			done: make(chan struct{}, 1), until: c.until}
		p.calls = append(p.calls, again)
	}
}
