package limiter

// logEntry is one admitted request in a sliding log: its time in
// microseconds and its cost.
type logEntry struct{ t, cost int64 }

// logCheck evaluates a request against a sliding log: exactly at most Rate
// tokens in any window of windowUS. It returns the verdict and the log
// without the entries that left the window (at or before now - windowUS).
func (r *Rule) logCheck(log []logEntry, now, cost, res int64) (verdict, []logEntry) {
	cut := 0
	for cut < len(log) && log[cut].t <= now-r.windowUS {
		cut++
	}
	log = log[cut:]
	v := verdict{res: res}
	for _, e := range log {
		v.used += e.cost
	}
	if len(log) > 0 {
		v.reset = log[len(log)-1].t + r.windowUS - now
	}
	switch {
	case cost+res > r.rate:
		v.never = true
	case v.used+cost+res <= r.rate:
		v.ok = true
	default:
		// The request fits once the oldest entries have left the window.
		need, freed := v.used+cost+res-r.rate, int64(0)
		for _, e := range log {
			freed += e.cost
			if freed >= need {
				v.retry = e.t + r.windowUS - now
				break
			}
		}
	}
	return v, log
}

func (r *Rule) logResult(v verdict, charged bool, cost int64) Result {
	switch {
	case charged:
		return Result{Allowed: true, Remaining: r.rate - v.used - cost, ResetAfter: us(r.windowUS)}
	case v.ok:
		return Result{Allowed: true, Remaining: r.rate - v.used, ResetAfter: us(v.reset)}
	case v.never:
		return Result{Remaining: r.rate - v.used, RetryAfter: Never, ResetAfter: us(v.reset)}
	}
	return Result{Remaining: r.rate - v.used, RetryAfter: us(v.retry), ResetAfter: us(v.reset)}
}
