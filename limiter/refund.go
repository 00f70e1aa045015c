package limiter

// Refunds: giving back a charge that Decide made, in memory (the Redis
// scripts' refund sections do the same, in lua/*.lua). A refund never
// gives back more than the charge, and a window gives back only what the
// window that counted the charge still counts: a refund can make a
// bucket fuller than it would have been without the request only by
// tokens that have refilled since (the token buckets' debt is clamped at
// empty), never beyond its limit. A token bucket's refund comes off its
// whole debt, also a debt beyond its capacity that a charge or a
// settlement left: it forgives none of it.

// refund returns the state of bucket e after giving back cost charged at
// microsecond at, seen at microsecond now, with the microsecond from which
// it counts nothing; keep is false when the bucket is then empty of
// charges (full) and can be dropped.
func (r *Rule) refund(e memEntry, now, cost, at int64) (st State, expires int64, keep bool) {
	switch r.alg {
	case FixedWindow, SlidingWindow:
		prev, curr, elapsed := r.windowCounts(e.state, now)
		w, aw := now/r.windowUS, at/r.windowUS
		switch {
		case aw == w && curr > 0:
			curr = max(0, curr-cost)
		case aw == w-1 && prev > 0 && r.alg == SlidingWindow:
			prev = max(0, prev-cost)
		default:
			return e.state, e.expires, true
		}
		expires := now + 2*r.windowUS - elapsed
		if r.alg == FixedWindow { // counts nothing after its window
			prev, expires = 0, now+r.windowUS-elapsed
		}
		return r.windowState(now, prev, curr), expires, true
	case Concurrency:
		held := int64(e.state) - cost
		return State(held), e.expires, held > 0
	case Quota:
		return r.quotaRefund(e, now, cost, at)
	}
	debt := r.debt(e.state, now) - cost*r.interval
	if r.alg == TokenBucket { // from the whole debt, as token_bucket.lua
		debt += r.over(e.state, now)
	}
	if debt <= 0 {
		return 0, 0, false
	}
	st = r.stateAt(now, debt)
	return st, st.fullAt(), true
}

// logRefund removes from a sliding log the entry of a charge of cost made
// at microsecond at, if it is still there.
func logRefund(log []logEntry, at, cost int64) []logEntry {
	for i := len(log) - 1; i >= 0; i-- {
		if log[i].t == at && log[i].cost == cost {
			return append(log[:i], log[i+1:]...)
		}
	}
	return log
}
