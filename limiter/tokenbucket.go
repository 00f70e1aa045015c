package limiter

import (
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// State is a token bucket as it is stored, in Redis and in memory: one
// integer, so that Redis keeps it in its smallest encoding. It is the
// bucket's theoretical arrival time (the moment it will be full again, GCRA
// style) in microseconds times 1000, plus the sub-microsecond remainder in
// ticks of the rule (below 1000). The zero State is a full bucket, and so is
// any State whose time has passed: a bucket that is full needs no storage.
type State int64

// parts splits a state into its whole microseconds and remaining ticks.
func (s State) parts() (us, ticks int64) {
	return int64(s) / fracScale, int64(s) % fracScale
}

// fullAt returns the microsecond at or after which the bucket is full.
func (s State) fullAt() int64 {
	us, ticks := s.parts()
	if ticks > 0 {
		us++
	}
	return us
}

// tbCheck evaluates a request of cost tokens that must leave res ticks in
// the bucket against a token bucket in state s at microsecond now. It
// changes nothing.
func (r *Rule) tbCheck(s State, now, cost, res int64) verdict {
	d := r.debt(s, now)
	if cost > r.burst || cost*r.interval+res > r.capacity {
		return verdict{debt: d, after: d, never: true}
	}
	after := d + cost*r.interval
	v := verdict{debt: d, after: after, ok: after+res <= r.capacity}
	if v.ok && r.shedMaxUS > 0 {
		v.delay = r.shedDelay(after, cost)
	}
	if !v.ok && d == r.capacity {
		v.over = r.over(s, now)
	}
	return v
}

// over returns how many ticks beyond its capacity the bucket in state s
// owes at microsecond now: what a charge or a settlement left owing beyond
// it (lua.MaxChargeDebt bounds the whole debt), 0 when it owes no more than
// its capacity.
func (r *Rule) over(s State, now int64) int64 {
	us, ticks := s.parts()
	if ticks >= r.denom { // written under a rule with a finer tick
		us += ticks / r.denom
		ticks %= r.denom
	}
	if us <= now {
		return 0
	}
	debt := int64(lua.MaxChargeDebt)
	if us-now <= lua.MaxChargeDebt/r.denom {
		debt = min((us-now)*r.denom+ticks, lua.MaxChargeDebt)
	}
	return max(0, debt-r.capacity)
}

// debt returns how many ticks the bucket in state s owes at microsecond now,
// clamped to the rule's capacity (a bucket written under a stricter rule may
// owe more than this rule's capacity: it is then simply empty).
func (r *Rule) debt(s State, now int64) int64 {
	us, ticks := s.parts()
	if ticks >= r.denom { // written under a rule with a finer tick
		us += ticks / r.denom
		ticks %= r.denom
	}
	if us < now || (us == now && ticks == 0) {
		return 0
	}
	if us-now > r.capacity/r.denom {
		return r.capacity
	}
	return min((us-now)*r.denom+ticks, r.capacity)
}

// stateAt encodes a debt of after ticks at microsecond now.
func (r *Rule) stateAt(now, after int64) State {
	return State((now+after/r.denom)*fracScale + after%r.denom)
}

// tbResult turns a token bucket verdict into the zone's Result. charged
// says whether the request was admitted by every zone and so charged to
// this one.
func (r *Rule) tbResult(v verdict, charged bool) Result {
	switch {
	case charged:
		return Result{
			Allowed:    true,
			Remaining:  (r.capacity-v.after)/r.interval + v.spares,
			ResetAfter: r.micros(v.after),
			Delay:      us(v.delay),
			owed:       v.after,
			spares:     v.spares,
		}
	case v.ok:
		return Result{
			Allowed:    true,
			Remaining:  (r.capacity - v.debt) / r.interval,
			ResetAfter: r.micros(v.debt),
			owed:       v.debt,
		}
	case v.never:
		return Result{
			Remaining:  (r.capacity - v.debt) / r.interval,
			RetryAfter: Never,
			ResetAfter: r.micros(v.debt + v.over),
			owed:       v.debt,
		}
	default: // a debt beyond the capacity (v.over) is repaid first
		return Result{
			Remaining:  (r.capacity - v.debt) / r.interval,
			RetryAfter: r.micros(v.after + v.over + v.res - r.capacity),
			ResetAfter: r.micros(v.debt + v.over),
			owed:       v.debt,
		}
	}
}

// micros converts ticks to a duration, rounded up to the microsecond so that
// a client told to wait that long is never early.
func (r *Rule) micros(ticks int64) time.Duration {
	return time.Duration(ceilDiv(ticks, r.denom)) * time.Microsecond
}

func ceilDiv(a, b int64) int64 {
	return (a + b - 1) / b
}
