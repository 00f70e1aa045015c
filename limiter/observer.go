package limiter

import "time"

// Observer learns what a Limiter does, for metrics and statistics. Its
// methods run on the request path, concurrently: they must be quick, must
// not block, and must be safe for concurrent use.
type Observer interface {
	// StoreDecided reports one call of the store's Decide: how long it
	// took, and its error (nil when the store decided). A call that an
	// open circuit breaker refused at once reports ErrBreakerOpen; a call
	// whose request went away reports context.Canceled.
	StoreDecided(took time.Duration, err error)
	// CacheDenied reports a request that the deny cache denied without
	// asking the store; rule is the zone whose cached bucket denied it.
	CacheDenied(rule *Rule)
	// Refunded reports a zone's refund (Limiter.Refund: a count_status
	// charge refunded, a concurrency slot refunded): err is nil when
	// the store applied it, else why it was dropped.
	Refunded(rule *Rule, err error)
}

// NumOutcomes is how many Outcome values there are: arrays indexed by
// Outcome have this length.
const NumOutcomes = int(DryRunDenied) + 1

// observeStore reports a store call that began at start, when the limiter
// has an observer.
func (l *Limiter) observeStore(start time.Time, err error) {
	if l.obs != nil {
		l.obs.StoreDecided(time.Since(start), err)
	}
}

// observeCacheHit reports a request the deny cache denied: the zone with a
// result that is known and not allowed is the one whose bucket denied it.
func (l *Limiter) observeCacheHit(reqs []Request, results []Result) {
	if l.obs == nil {
		return
	}
	for i := range results {
		if !results[i].Allowed && !results[i].Unknown {
			l.obs.CacheDenied(reqs[i].Rule)
			return
		}
	}
}

// observeStart returns the start time of a store call to report, or the zero
// time when the limiter has no observer (saving the clock read).
func (l *Limiter) observeStart() time.Time {
	if l.obs == nil {
		return time.Time{}
	}
	return time.Now()
}
