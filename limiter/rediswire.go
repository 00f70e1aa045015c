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
// (each once, ruleArgs arguments each), then per call one argument per
// zone (its bucket, its kind and whether it ends the call, in one number;
// -1 for a call of no zones), then the zone kinds (its rule's index, from
// 1, a cost and an aux, which the zones of a batch mostly share) and their
// number. See decide.lua.
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
	args := make([]any, 0, 6+len(keys)+ruleArgs*len(rules)+len(g.calls)+2*len(zones))
	args = append(args, "evalsha", g.script.Hash(), len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, clock, len(rules))
	for _, r := range rules {
		args = append(args, r.scriptArgs()...)
	}
	kinds := make([]zoneKind, 0, 8)
	next := zones
	for _, c := range g.calls {
		if len(c.keys) == 0 {
			args = append(args, -1)
			continue
		}
		for z, cost := range c.costs {
			kind := zoneKind{next[0], cost, c.aux[z]}
			k := kindIndex(kinds, kind)
			if k < 0 {
				kinds = append(kinds, kind)
				k = len(kinds) - 1
			}
			last := 0
			if z == len(c.costs)-1 {
				last = 1
			}
			args = append(args, (k*len(keys)+next[1]-1)*2+last)
			next = next[2:]
		}
	}
	for _, k := range kinds {
		args = append(args, k.rule, k.cost, k.aux)
	}
	args = append(args, len(kinds))
	clear(rules)
	clear(keys)
	p.rules, p.keys, p.zones = rules[:0], keys[:0], zones[:0]
	return args
}

// zoneKind is what the zones of a script call may share: the index of
// their rule (from 1), their cost and their aux.
type zoneKind struct {
	rule int
	cost int64
	aux  any
}

// kindSearch bounds how many of the latest kinds kindIndex compares: a
// batch has few kinds (a zone's rule, cost 1 and no reserve, say) unless
// its aux differ (concurrency slots, refunds), and those would make the
// search quadratic.
const kindSearch = 8

// kindIndex returns the index of kind among the last kindSearch of kinds,
// or -1.
func kindIndex(kinds []zoneKind, kind zoneKind) int {
	for i := len(kinds) - 1; i >= max(0, len(kinds)-kindSearch); i-- {
		if kinds[i] == kind {
			return i
		}
	}
	return -1
}

// replyLen is how many values of the decide script's flat reply belong to
// a request of zones zones: the time, negative if the request was denied
// (or the request's error), then four per zone.
func replyLen(zones int) int { return 1 + 4*zones }

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
	at, _ := reply[0].(int64)
	admit := at > 0
	if !admit {
		at = -at
	}
	var vals [4]int64
	for i := range reqs {
		for j := range 4 {
			n, ok := reply[1+4*i+j].(int64)
			if !ok {
				return false, fmt.Errorf("redis: unexpected script reply value %T", reply[1+4*i+j])
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
