package limiter

// leakyCheck evaluates a request against a leaky bucket used as a shaper:
// its state is a token bucket's (the time the queue drains), the request
// may wait for its turn as long as at most Burst tokens are queued with it
// and its wait is at most maxDelayUS; then it proceeds at the bucket's
// steady rate.
func (r *Rule) leakyCheck(s State, now, cost, res int64) verdict {
	d := r.debt(s, now)
	if cost > r.burst || cost*r.interval+res > r.capacity {
		return verdict{debt: d, after: d, never: true}
	}
	after := d + cost*r.interval
	return verdict{debt: d, after: after, ok: after+res <= r.capacity && ceilDiv(d, r.denom) <= r.maxDelayUS}
}

// leakyResult is the token bucket's result (Remaining: the tokens the queue
// can still take; ResetAfter: until it drains) with the request's Delay,
// and a RetryAfter that also waits for the delay to fit maxDelayUS.
func (r *Rule) leakyResult(v verdict, charged bool) Result {
	res := r.tbResult(v, charged)
	switch {
	case charged:
		res.Delay = us(ceilDiv(v.debt, r.denom))
	case !v.ok && !v.never:
		retry := max(ceilDiv(v.after+v.res-r.capacity, r.denom), ceilDiv(v.debt, r.denom)-r.maxDelayUS, 1)
		res.RetryAfter = us(retry)
	}
	return res
}
