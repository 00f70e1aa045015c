package limiter

// The decide script's wire format: what a script call sends (its KEYS, the
// clock, the rules, and per call its zones) and how its reply reads. Both
// must mirror lua/decide.lua (and lua/refund.lua, which takes the same
// arguments): a change on one side is a change on the other.

import (
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// fill sets a call's script, and per zone its key, rule, cost and aux.
// done is nil for a decision; for a refund it holds the results of the
// decision refunded (their times).
func (s *RedisStore) fill(c *call, script *redis.Script, reqs []Request, idx []int, done []Result) {
	c.script = script
	c.keys, c.rules, c.costs, c.aux = c.keys[:0], c.rules[:0], c.costs[:0], c.aux[:0]
	add := func(i int) {
		q := &reqs[i]
		c.keys = append(c.keys, s.Key(q.Rule.bucket, q.Key))
		c.rules = append(c.rules, q.Rule)
		c.costs = append(c.costs, zoneCost(q, done, i))
		c.aux = append(c.aux, zoneAux(q, done, i))
	}
	if idx == nil {
		for i := range reqs {
			add(i)
		}
	} else {
		for _, i := range idx {
			add(i)
		}
	}
}

// zoneCost returns the cost argument of zone i of a script call: the
// request's cost, except in the refund of a dry-run zone that would have
// denied, which charged nothing (0: the refund script skips the zone).
func zoneCost(q *Request, done []Result, i int) int64 {
	if done != nil && done[i].DryRun {
		return 0
	}
	return q.Cost
}

// zoneAux returns the aux argument of zone i of a script call: the slot's
// id for a concurrency zone; for a decision the reserve the request must
// leave (in the algorithm's units), for a refund the time of the charge.
func zoneAux(q *Request, done []Result, i int) any {
	switch {
	case q.Rule.alg == Concurrency:
		return q.Slot
	case done != nil:
		return done[i].at
	}
	return q.Rule.reserveUnits(q.Reserve)
}

// scriptArgs returns a script call's command: EVALSHA, the distinct
// buckets of all its calls, the clock ("0": Redis TIME), the rules they use
// (each once, ruleArgs arguments each), then per call its number of zones
// and per zone its rule's index, its bucket's index (both from 1), its cost
// and its aux. See decide.lua.
func (p *pipeline) scriptArgs(g *scriptCall, clock string) []any {
	if p.buckets == nil {
		p.buckets = make(map[string]int)
	}
	rules, keys, zones := p.rules[:0], p.keys[:0], p.zones[:0]
	clear(p.buckets)
	for _, c := range g.calls {
		for z, r := range c.rules {
			ri := slices.Index(rules, r)
			if ri < 0 {
				rules = append(rules, r)
				ri = len(rules) - 1
			}
			ki, ok := p.buckets[c.keys[z]]
			if !ok {
				keys = append(keys, c.keys[z])
				ki = len(keys)
				p.buckets[c.keys[z]] = ki
			}
			zones = append(zones, ri+1, ki)
		}
	}
	args := make([]any, 0, 5+len(keys)+ruleArgs*len(rules)+len(g.calls)+2*len(zones))
	args = append(args, "evalsha", g.script.Hash(), len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, clock, len(rules))
	for _, r := range rules {
		args = append(args, r.scriptArgs()...)
	}
	next := zones
	for _, c := range g.calls {
		args = append(args, len(c.keys))
		for z, cost := range c.costs {
			args = append(args, next[0], next[1], cost, c.aux[z])
			next = next[2:]
		}
	}
	clear(rules)
	clear(keys)
	p.rules, p.keys, p.zones = rules[:0], keys[:0], zones[:0]
	return args
}

// replyLen is how many values of the decide script's flat reply belong to
// a request of zones zones: admitted (or the request's error), the time,
// then four per zone.
func replyLen(zones int) int { return 2 + 4*zones }

// decodeReply turns the script's reply into results, through the same
// Rule.result as the memory store.
func decodeReply(reply []any, reqs []Request, results []Result) (bool, error) {
	return decodeReplyAs(reply, reqs, results, true)
}

// decodeReplyAs is decodeReply; with charged false it reports every zone as
// not charged (the request was refunded).
func decodeReplyAs(reply []any, reqs []Request, results []Result, charged bool) (bool, error) {
	if len(reply) != replyLen(len(reqs)) {
		return false, fmt.Errorf("redis: unexpected script reply of %d values for %d zones", len(reply), len(reqs))
	}
	admit := false
	if n, ok := reply[0].(int64); ok {
		admit = n == 1
	}
	at, _ := reply[1].(int64)
	var vals [4]int64
	for i := range reqs {
		for j := range 4 {
			n, ok := reply[2+4*i+j].(int64)
			if !ok {
				return false, fmt.Errorf("redis: unexpected script reply value %T", reply[2+4*i+j])
			}
			vals[j] = n
		}
		q := &reqs[i]
		v := q.Rule.fromReply(vals, q.Rule.reserveUnits(q.Reserve))
		results[i] = q.Rule.result(v, admit && charged && v.ok, q.Cost)
		results[i].at = at
		results[i].spares = v.spares // what the store took, even if refunded
	}
	return admit, nil
}
