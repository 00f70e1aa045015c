package limiter

import (
	"fmt"
	"slices"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
	"github.com/redis/go-redis/v9"
)

// The decide script's wire format, the Go side: a script call's arguments and
// how its reply reads, in package lua's positions.

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
// (each once, lua.RuleArgs arguments each), then per call one argument per
// zone (its bucket, its kind and whether it ends the call, in one number;
// lua.NoZones for a call of no zones), then the zone kinds (its rule's
// index, from 1, a cost and an aux, which the zones of a batch mostly
// share) and their number, at the positions package lua declares
// (lua.ArgClock, lua.ArgRules and the rest). With runs (the decide script
// only), consecutive calls of one zone that share its bucket, rule, cost
// and aux are sent as one run (lua.RunOf).
func (p *pipeline) scriptArgs(g *scriptCall, clock string, runs bool) []any {
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
	// zones holds two numbers per zone; a zone takes one argument and
	// mostly a kind of its own.
	args := make([]any, 0, 6+len(keys)+lua.RuleArgs*len(rules)+len(g.calls)+(1+lua.KindArgs)*len(zones)/2)
	args = append(args, "evalsha", g.script.Hash(), len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	argv := len(args) - 1 // args[argv+i] is ARGV[i]
	args = append(args, make([]any, lua.ArgRules)...)
	args[argv+lua.ArgClock], args[argv+lua.ArgRules] = clock, len(rules)
	for _, r := range rules {
		if r.alg == Quota {
			args = append(args, r.quotaArgs(p.nodeNow())...)
			continue
		}
		args = append(args, r.scriptArgs()...)
	}
	kinds := make([]zoneKind, 0, 8)
	next := zones
	for i := 0; i < len(g.calls); i++ {
		c := g.calls[i]
		if len(c.keys) == 0 {
			args = append(args, lua.NoZones)
			continue
		}
		if reps := runLen(g.calls[i:]); runs && reps > 1 {
			// The run's last zone stands for all its calls' (they are
			// the same): skip the others'.
			args = append(args, lua.RunOf(reps))
			i += reps - 1
			next = next[2*(reps-1):]
			c = g.calls[i]
		}
		for z, cost := range c.costs {
			kind := zoneKind{next[0], cost, c.aux[z]}
			k := kindIndex(kinds, kind)
			if k < 0 {
				kinds = append(kinds, kind)
				k = len(kinds) - 1
			}
			args = append(args, lua.PackZone(k+1, next[1], len(keys), z == len(c.costs)-1))
			next = next[2:]
		}
	}
	for _, k := range kinds {
		b := len(args) - 1 // args[b+i] is the kind's i-th argument
		args = append(args, make([]any, lua.KindArgs)...)
		args[b+lua.KindRule], args[b+lua.KindCost], args[b+lua.KindAux] = k.rule, k.cost, k.aux
	}
	args = append(args, len(kinds))
	clear(rules)
	clear(keys)
	p.rules, p.keys, p.zones = rules[:0], keys[:0], zones[:0]
	return args
}

// runLen returns how many calls from calls[0] make one run: calls of one
// zone each with the same bucket, rule, cost and aux (1 when calls[0] has
// another number of zones).
func runLen(calls []*call) int {
	c := calls[0]
	if len(c.keys) != 1 {
		return 1
	}
	n := 1
	for ; n < len(calls); n++ {
		d := calls[n]
		if len(d.keys) != 1 || d.keys[0] != c.keys[0] || d.rules[0] != c.rules[0] || d.costs[0] != c.costs[0] || d.aux[0] != c.aux[0] {
			break
		}
	}
	return n
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

// replyLen is how many values of the decide script's reply belong to a
// request of zones zones (see lua.ReplyLen).
func replyLen(zones int) int { return lua.ReplyLen(zones) }

// decodeReply turns the script's reply into results, through the same
// Rule.result as the memory store.
func decodeReply(reply []any, reqs []Request, results []Result) (bool, error) {
	return decodeReplyAs(reply, reqs, results, true)
}

// decodeReplyAs is decodeReply; with charged false it reports every zone as
// not charged (the request was refunded).
func decodeReplyAs(reply []any, reqs []Request, results []Result, charged bool) (bool, error) {
	if len(reply) != lua.ReplyLen(len(reqs)) {
		return false, fmt.Errorf("redis: unexpected script reply of %d values for %d zones", len(reply), len(reqs))
	}
	at, _ := reply[0].(int64)
	admit := at > 0
	if !admit {
		at = -at
	}
	var vals zoneReply
	for i := range reqs {
		for j := range vals {
			n, ok := reply[i*lua.ReplyZone+1+j].(int64)
			if !ok {
				return false, fmt.Errorf("redis: unexpected script reply value %T", reply[i*lua.ReplyZone+1+j])
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

// zoneReply is a zone's values in the decide script's reply, at
// lua.ReplyFlag-1 to lua.ReplyDelay-1.
type zoneReply [lua.ReplyZone]int64

// scriptArgs returns the rule's algorithm, four parameters, flags, ban,
// prefetch and soft shed as the Redis scripts take them (lua.RuleAlg …),
// boxed once (a request adds its cost and aux).
func (r *Rule) scriptArgs() []any {
	r.argsOnce.Do(func() {
		p := r.scriptParams()
		var flags int64
		if r.dryRun {
			flags |= lua.RuleDryRun
		}
		a := make([]any, lua.RuleArgs+1) // a[i] is the rule's i-th argument
		a[lua.RuleAlg] = int64(r.alg)
		a[lua.RuleP1], a[lua.RuleP2], a[lua.RuleP3], a[lua.RuleP4] = p[0], p[1], p[2], p[3]
		a[lua.RuleFlags] = flags
		a[lua.RuleBan], a[lua.RuleBanDenials], a[lua.RuleBanWindow] = r.banUS, r.banAfter, r.banWindowUS
		a[lua.RulePrefetch] = r.prefetch
		a[lua.RuleShedAt], a[lua.RuleShedDelay] = r.shedAt, r.shedMaxUS
		r.args = a[1:]
	})
	return r.args
}

// scriptParams returns the rule's four parameters for the Redis scripts.
func (r *Rule) scriptParams() [4]int64 {
	switch r.alg {
	case FixedWindow, SlidingWindow, SlidingLog:
		return [4]int64{r.windowUS, r.rate, 0, 0}
	case LeakyBucket:
		return [4]int64{r.denom, r.interval, r.burst, r.maxDelayUS}
	case Concurrency:
		return [4]int64{r.rate, r.leaseUS, 0, 0}
	case Quota:
		return [4]int64{0, 0, 0, r.rate} // the periods: see quotaArgs
	}
	return [4]int64{r.denom, r.interval, r.burst, 0}
}

// fromReply rebuilds a verdict from a zone's values in the script's reply:
// its flag (lua.FlagAdmit …, plus lua.FlagBanStarted when the denial
// started a ban), three that depend on the algorithm (banned: the ban's
// microseconds left and its denials) and an admitted request's delay (a
// token bucket's soft shed). res is the reserve the request had to leave.
func (r *Rule) fromReply(z zoneReply, res int64) verdict {
	flag, r1, r2, r3 := z[lua.ReplyFlag-1], z[lua.ReplyR1-1], z[lua.ReplyR2-1], z[lua.ReplyR3-1]
	started := flag >= lua.FlagBanStarted
	if started {
		flag -= lua.FlagBanStarted
	}
	v := verdict{ok: flag == lua.FlagAdmit, never: flag == lua.FlagNever, banStarted: started, res: res}
	if flag == lua.FlagBanned {
		v.banned, v.banLeft, v.banDenials = true, r1, r2
		return v
	}
	switch r.alg {
	case FixedWindow:
		v.curr, v.elapsed, v.spares = r1, r2, r3
	case SlidingWindow:
		v.prev, v.curr, v.elapsed = r1, r2, r3
	case SlidingLog:
		v.used, v.retry, v.reset = r1, r2, r3
	case Concurrency:
		v.slots = r1
	case Quota:
		v.curr, v.reset, v.periodUS = r1, r2, r3
	default:
		v.debt, v.after = r1, r2
		switch {
		case r.alg != TokenBucket:
		case v.ok:
			v.spares, v.delay = r3, z[lua.ReplyDelay-1]
		default:
			v.over = r3
		}
	}
	return v
}
