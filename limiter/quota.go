package limiter

import (
	"errors"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// The quota algorithm: at most Rate per calendar period, in the rule's time
// zone.

// quotaTags is how many period tags a quota state tells apart: consecutive
// periods never share a tag (a day, a week or a month is never a whole
// multiple of 1024 minutes), and a state outlives its period by nothing
// (its key or entry expires at the period's end).
const quotaTags = 1024

// MaxQuota is the largest quota per period: counts times quotaTags stay
// exact in the doubles of the Lua script.
const MaxQuota = 1 << 40

// Errors of the quota's rules.
var (
	// ErrQuotaLimit: the quota is above MaxQuota.
	ErrQuotaLimit = errors.New("a quota must be at most 2^40 per period")
	// ErrBadPeriod: a quota without a period of the calendar.
	ErrBadPeriod = errors.New("a quota needs a period: day, week or month")
)

// quotaRule compiles a quota's rule: cfg.Rate per cfg.Period in
// cfg.Location (UTC when nil).
func quotaRule(cfg RuleConfig) (*Rule, error) {
	switch {
	case cfg.Rate <= 0:
		return nil, ErrBadRate
	case cfg.Rate > MaxQuota:
		return nil, ErrQuotaLimit
	case cfg.Period < Day || cfg.Period > Month:
		return nil, ErrBadPeriod
	case cfg.Burst != 0:
		return nil, ErrBurstNotApplicable
	}
	loc := cfg.Location
	if loc == nil {
		loc = time.UTC
	}
	return &Rule{name: cfg.Name, bucket: bucketName(cfg.Name, Quota), alg: Quota, rate: cfg.Rate,
		per: cfg.Period.nominal(), burst: cfg.Rate, exact: true, period: cfg.Period, loc: loc}, nil
}

// QuotaPeriod returns a quota's calendar period (0 for the other
// algorithms).
func (r *Rule) QuotaPeriod() Period { return r.period }

// Location returns a quota's time zone (nil for the other algorithms).
func (r *Rule) Location() *time.Location { return r.loc }

// quotaWindow is what a quota rule sends Redis while the node's time is in
// [from, until): the first instants b[0] < b[1] < b[2] (unix microseconds)
// of three consecutive periods, with the node's time in the middle, and
// the rule's script arguments with them.
type quotaWindow struct {
	from, until int64
	b           [3]int64
	args        []any
}

// quotaWindowAt returns the rule's window for microsecond now: the one kept
// while now is in its range, else a new one (kept for the next calls).
func (r *Rule) quotaWindowAt(now int64) *quotaWindow {
	if w := r.cal.Load(); w != nil && now >= w.from && now < w.until {
		return w
	}
	t := time.UnixMicro(now)
	s, e := r.period.bounds(t, r.loc)
	su, eu := s.UnixMicro(), e.UnixMicro()
	mid := su + (eu-su)/2
	w := &quotaWindow{}
	if now < mid {
		ps, _ := r.period.bounds(s.Add(-time.Nanosecond), r.loc)
		w.b, w.from, w.until = [3]int64{ps.UnixMicro(), su, eu}, su, mid
	} else {
		_, ne := r.period.bounds(e, r.loc)
		w.b, w.from, w.until = [3]int64{su, eu, ne.UnixMicro()}, mid, eu
	}
	// The script arguments: the rule's, with the window's instants as
	// its first three parameters (scriptArgs' slice starts at RuleAlg).
	w.args = append([]any(nil), r.scriptArgs()...)
	w.args[lua.RuleP1-1], w.args[lua.RuleP2-1], w.args[lua.RuleP3-1] = w.b[0], w.b[1], w.b[2]
	r.cal.Store(w)
	return w
}

// periodAt returns the period that holds microsecond now: its first
// instant and the next period's.
func (r *Rule) periodAt(now int64) (start, end int64) {
	w := r.quotaWindowAt(now)
	if now < w.b[1] {
		return w.b[0], w.b[1]
	}
	return w.b[1], w.b[2]
}

// PeriodAt returns the quota's period that holds t (see Period): its first
// instant and the next period's.
func (r *Rule) PeriodAt(t time.Time) (start, end time.Time) {
	return r.period.bounds(t, r.loc)
}

// quotaTag returns the tag of the period that starts at microsecond start.
func quotaTag(start int64) int64 {
	m := start / 60_000_000
	if start < 0 && start%60_000_000 != 0 {
		m-- // floor, as Lua's division
	}
	return ((m % quotaTags) + quotaTags) % quotaTags
}

// quotaUsed returns the count that state s holds for the period starting at
// microsecond start: 0 for another period's.
func quotaUsed(s State, start int64) int64 {
	if s <= 0 || int64(s)%quotaTags != quotaTag(start) {
		return 0
	}
	return int64(s) / quotaTags
}

// quotaCheck evaluates a request of cost that must leave res of the quota
// against state s at microsecond now.
func (r *Rule) quotaCheck(s State, now, cost, res int64) verdict {
	start, end := r.periodAt(now)
	v := verdict{curr: quotaUsed(s, start), reset: end - now, periodUS: end - start}
	if cost+res > r.rate {
		v.never = true
	} else {
		v.ok = v.curr+cost+res <= r.rate
	}
	return v
}

// quotaCommit returns the state after charging cost, and its end: the
// period's.
func (r *Rule) quotaCommit(v verdict, now, cost int64) (State, int64) {
	start := now + v.reset - v.periodUS
	return State((v.curr+cost)*quotaTags + quotaTag(start)), now + v.reset
}

// quotaResult is a quota's result: Remaining what is left of the period's
// quota, ResetAfter (and a denial's RetryAfter) the time until the period
// ends, Period its length.
func (r *Rule) quotaResult(v verdict, charged bool, cost int64) Result {
	used := v.curr
	if charged {
		used += cost
	}
	res := Result{Allowed: charged || v.ok, Remaining: max(0, r.rate-used), ResetAfter: us(v.reset), Period: us(v.periodUS), owed: used}
	switch {
	case res.Allowed:
	case v.never:
		res.RetryAfter = Never
	default:
		res.RetryAfter = us(v.reset) // the next period starts empty
	}
	return res
}

// quotaRefund refunds cost charged at microsecond at, if the period that
// counted it is still the current one.
func (r *Rule) quotaRefund(e memEntry, now, cost, at int64) (State, int64, bool) {
	start, end := r.periodAt(now)
	used := quotaUsed(e.state, start)
	if at < start || at >= end || used == 0 {
		return e.state, e.expires, true
	}
	return State(max(0, used-cost)*quotaTags + quotaTag(start)), end, true
}

// quotaCharge returns the state of a quota after a settlement's charge of n
// (cost_header), seen at microsecond now: the current period counts it, its
// count at most twice the quota (the script's quota charge).
func (r *Rule) quotaCharge(s State, now, n int64) (State, int64) {
	start, end := r.periodAt(now)
	used := min(quotaUsed(s, start)+n, 2*r.rate)
	return State(used*quotaTags + quotaTag(start)), end
}

// quotaCapped returns n requests of a quota's charge or seed, at most
// twice the quota (as a settlement's charge leaves it at most).
func (r *Rule) quotaCapped(n int64) int64 { return min(max(n, 0), 2*r.rate) }

// quotaSeed returns an outage charge's seed as the script takes it: the
// count seen, as a state of the period that starts at microsecond period.
func (r *Rule) quotaSeed(seen, period int64) int64 {
	return r.quotaCapped(seen)*quotaTags + quotaTag(period)
}

// quotaOutage returns the state of a quota after an outage's charge ch
// (see Charge.Period; the script's), at microsecond now, of a key that
// holds state s (held: the key holds a count at all) and whose count
// outage charges rebuilt lately, with added requests since (-1: not
// rebuilt); its end; and what the rebuilt count's charges added after it
// (-1: none). taken is false when the current period is not ch's: the
// charge then changes nothing.
func (r *Rule) quotaOutage(s State, held bool, added, now int64, ch *Charge) (st State, end, after int64, taken bool) {
	start, end := r.periodAt(now)
	tag := quotaTag(start)
	if quotaTag(ch.Period) != tag {
		return s, end, added, false
	}
	used := quotaUsed(s, start)
	if !held || int64(s)%quotaTags != tag {
		used, added = 0, 0 // Redis no longer holds the count: rebuild it
	}
	n := r.quotaCapped(ch.Ticks)
	count := min(max(used-max(added, 0), r.quotaCapped(ch.Seen))+max(added, 0)+n, 2*r.rate)
	if added >= 0 {
		added = min(added+n, count)
	}
	return State(count*quotaTags + tag), end, added, true
}

// quotaArgs returns a quota's arguments for the Redis scripts at this
// node's microsecond now: the rule's, with the first instants of the three
// periods around now as its first three parameters.
func (r *Rule) quotaArgs(now int64) []any { return r.quotaWindowAt(now).args }
