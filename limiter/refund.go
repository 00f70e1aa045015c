package limiter

import "context"

// Refunds: a charge that Decide made, given back (Limiter.Refund), and the
// memory store's arithmetic of one.

// Refund refunds what the decision of outcome charged the zones of
// reqs, with the results Decide returned for them: pass the zones whose
// charge is to be refunded (a response that a count_status zone does
// not count) and the concurrency zones, whose slots their request holds
// until this call. Decisions that charged nothing (denied, failed open or
// closed) need none. A decision made on the local fallback buckets is
// refunded there. When the store fails, the refund is dropped (the charge
// stays: strict, never lenient; a slot then ends with its lease) and
// counted (see Refunds).
func (l *Limiter) Refund(ctx context.Context, outcome Outcome, reqs []Request, results []Result) error {
	if len(reqs) == 0 {
		return nil
	}
	l.refunds.Add(1)
	var err error
	switch outcome {
	case Allowed:
		err = l.store.Refund(ctx, reqs, results)
	case LocalAllowed:
		err = l.refundLocal(ctx, reqs, results)
	default:
		return nil
	}
	if err != nil {
		l.refundsLost.Add(1)
	}
	if l.obs != nil {
		for i := range reqs {
			l.obs.Refunded(reqs[i].Rule, err)
		}
	}
	return err
}

// refundLocal refunds, on this node's fallback buckets, a decision made
// there.
func (l *Limiter) refundLocal(ctx context.Context, reqs []Request, results []Result) error {
	if l.local == nil {
		return nil
	}
	view := int64(1)
	if l.fleet != nil {
		view = l.fleet()
	}
	lreqs := make([]Request, 0, len(reqs))
	lres := make([]Result, 0, len(reqs))
	for i := range reqs {
		if r := reqs[i].Rule; r.onError == PolicyLocal && r.local != nil && !results[i].Unknown {
			local, _ := r.localFor(view)
			q := reqs[i]
			q.Rule = local
			lreqs, lres = append(lreqs, q), append(lres, results[i])
		}
	}
	return l.local.Refund(ctx, lreqs, lres)
}

// Refunds returns how many refunds were asked for, and how many of them
// the store failed (dropped).
func (l *Limiter) Refunds() (asked, lost uint64) {
	return l.refunds.Load(), l.refundsLost.Load()
}

// In memory (the refund sections of package lua's scripts do the same in
// Redis), a refund never returns more than the charge, and a window refunds only what the
// window that counted the charge still counts: a refund can make a
// bucket fuller than it would have been without the request only by
// tokens that have refilled since (the token buckets' debt is clamped at
// empty), never beyond its limit. A token bucket's refund comes off its
// whole debt, also a debt beyond its capacity that a charge or a
// settlement left: it forgives none of it.

// refund returns the state of bucket e after refunding cost charged at
// microsecond at, seen at microsecond now, with the microsecond from which
// it counts nothing; keep is false when the bucket is then empty of
// charges (full) and can be dropped.
func (r *Rule) refund(e memEntry, now, cost, at int64) (st State, expires int64, keep bool) {
	switch r.alg {
	case FixedWindow: // counts nothing after its window
		curr, elapsed := r.fixedCounts(e.state, now)
		if at/r.windowUS != now/r.windowUS || curr == 0 {
			return e.state, e.expires, true
		}
		return r.fixedState(now, max(0, curr-cost)), now + r.windowUS - elapsed, true
	case SlidingWindow:
		prev, curr, elapsed := r.windowCounts(e.state, now)
		w, aw := now/r.windowUS, at/r.windowUS
		switch {
		case aw == w && curr > 0:
			curr = max(0, curr-cost)
		case aw == w-1 && prev > 0:
			prev = max(0, prev-cost)
		default:
			return e.state, e.expires, true
		}
		return r.windowState(now, prev, curr), now + 2*r.windowUS - elapsed, true
	case Concurrency:
		held := int64(e.state) - cost
		return State(held), e.expires, held > 0
	case Quota:
		return r.quotaRefund(e, now, cost, at)
	}
	debt := r.debt(e.state, now) - cost*r.interval
	if r.alg == TokenBucket { // from the whole debt, as the script's token bucket
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
