package limiter

import (
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// Refunds of abandoned decisions: what Redis charged a call whose caller no
// longer waits, refunded by the pipeline worker.

// refundCall returns the refund call that refunds what the abandoned
// decision c was charged, or nil when it was charged nothing (denied, or
// failed).
func (s *RedisStore) refundCall(c *call) *call {
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
	s.abandonedRefunded.Add(1)
	return g
}

// AbandonedRefunded returns how many abandoned decisions had their charges given
// back (see refundCall).
func (s *RedisStore) AbandonedRefunded() uint64 { return s.abandonedRefunded.Load() }

// slotRefundCall returns the refund call that refunds the concurrency slots
// of the call c, whose reply was lost with its connection (see the top of
// this file): a decision that may have taken them, or a slot refund (a
// request's end) that may not have reached Redis. It returns nil when c has
// no slot, got an answer, or is such a slot refund tried again already.
func (s *RedisStore) slotRefundCall(c *call) *call {
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
		s.slotRefundsSent.Add(1)
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

// maxPendingSlotRefunds bounds the slot refunds a store keeps to try again.
const maxPendingSlotRefunds = 4096

// pendingSlotRefunds are slot refunds that could not reach Redis, kept to try
// again after later batches until their leases would have ended.
type pendingSlotRefunds struct {
	mu    sync.Mutex
	calls []*call
}

// waiting reports whether slot refunds wait to be tried again.
func (p *pendingSlotRefunds) waiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls) > 0
}

// take returns the slot refunds waiting, and forgets them.
func (p *pendingSlotRefunds) take() []*call {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.calls
	p.calls = nil
	return out
}

// keepUnsent keeps slot refunds made while a round of slot refunds ran (of
// its calls whose replies were lost), to send with the next round.
func (p *pendingSlotRefunds) keepUnsent(calls []*call) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range calls {
		if !c.until.IsZero() && len(p.calls) < maxPendingSlotRefunds {
			p.calls = append(p.calls, c)
		}
	}
}

// keepFailed keeps, of the calls just sent, the slot refunds that could
// not reach Redis and whose leases have not ended at now, as fresh calls.
func (p *pendingSlotRefunds) keepFailed(sent []*call, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range sent {
		if c.until.IsZero() || c.err == nil || !lostReply(c.err) || !now.Before(c.until) || len(p.calls) >= maxPendingSlotRefunds {
			continue
		}
		again := &call{script: c.script, keys: c.keys, rules: c.rules, costs: c.costs, aux: c.aux,
			done: make(chan struct{}, 1), until: c.until}
		p.calls = append(p.calls, again)
	}
}
