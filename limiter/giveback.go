package limiter

import "github.com/fleetlimit/caddy-fleetlimit/lua"

// Charges given back. A decision whose caller stopped waiting (the store's
// timeout) after its script call was sent is still run by Redis, late. Its
// request has taken its zones' failure policy by then (the local fallback
// decided it again, say), so what Redis charged it (tokens, a prefetching
// zone's spares, a window's count, a concurrency slot) belongs to no
// request: the pipeline worker that reads the late reply gives it back in
// a refund call, sent right after the batch. A reply that never comes (the
// connection broke) leaves the charge in place: a slot then ends with its
// lease, tokens with the refill.

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
