package limiter

import "time"

// A fixed window's state is the packed counters of the window algorithms
// (windowState) while its count fits their 21 bits, as it always does
// with a Rate up to MaxWindowLimit. A larger count is kept wide: the
// negative of the window's index modulo 1024 times 2^42 plus the count,
// still below 2^52 in magnitude, so exact in the doubles of the Lua
// script (lua/fixed_window.lua). The sign tells the two apart: every other
// state is positive, and the other algorithms read a negative one as
// empty.
const (
	// MaxFixedWindowLimit is the largest Rate of a fixed window: its count
	// has 42 bits in a wide state.
	MaxFixedWindowLimit = 1<<wideCountBits - 1
	wideCountBits       = 42
	// maxFixedWindowMS bounds a fixed window in milliseconds (about 34
	// years), so that a time and a window's length in microseconds add up
	// exactly in a double.
	maxFixedWindowMS = 1 << 40
)

// fixedCounts unpacks a fixed window's state as seen at microsecond now:
// the current window's count (zero for another window's state), and the
// microseconds into the current window.
func (r *Rule) fixedCounts(s State, now int64) (curr, elapsed int64) {
	if s >= 0 {
		// A state from the previous window reports its count as prev:
		// a fixed window forgets it.
		_, curr, elapsed = r.windowCounts(s, now)
		return curr, elapsed
	}
	w := now / r.windowUS
	elapsed = now - w*r.windowUS
	if wide := -int64(s); wide>>wideCountBits == w%windowIdxMod {
		return wide & MaxFixedWindowLimit, elapsed
	}
	return 0, elapsed
}

// fixedState packs a fixed window's count at microsecond now: the window
// algorithms' packed counters while the count fits them, else wide.
func (r *Rule) fixedState(now, count int64) State {
	if count <= MaxWindowLimit {
		return r.windowState(now, 0, count)
	}
	idx := (now / r.windowUS) % windowIdxMod
	return State(-(idx<<wideCountBits | count))
}

// fixedCheck evaluates a request against a fixed window counter: at most
// Rate per window, the windows aligned to the clock.
func (r *Rule) fixedCheck(s State, now, cost, res int64) verdict {
	curr, elapsed := r.fixedCounts(s, now)
	v := verdict{curr: curr, elapsed: elapsed}
	switch {
	case cost+res > r.rate:
		v.never = true
	default:
		v.ok = curr+cost+res <= r.rate
	}
	return v
}

func (r *Rule) fixedResult(v verdict, charged bool, cost int64) Result {
	end := r.windowUS - v.elapsed // until the window ends
	// A count above the rate (lowered in a reload) leaves nothing.
	res := Result{Remaining: max(0, r.rate-v.curr), ResetAfter: us(end)}
	if v.curr == 0 {
		res.ResetAfter = 0
	}
	switch {
	case charged:
		res.Allowed, res.Remaining, res.ResetAfter = true, r.rate-v.curr-cost, us(end)
		res.spares = v.spares // counted in the window, held by the node
	case v.ok:
		res.Allowed = true
	case v.never:
		res.RetryAfter = Never
	default:
		res.RetryAfter = us(end) // the next window starts empty
	}
	return res
}

// slidingCheck evaluates a request against the sliding window estimate:
// the previous window's count weighted by the share of it the sliding
// window still covers, plus the current window's count. The share is
// counted in whole milliseconds, rounded in the strict direction, so that
// the products stay exact in a double.
func (r *Rule) slidingCheck(s State, now, cost, res int64) verdict {
	prev, curr, elapsed := r.windowCounts(s, now)
	v := verdict{prev: prev, curr: curr, elapsed: elapsed}
	if cost+res > r.rate {
		v.never = true
		return v
	}
	wms := r.windowUS / 1000
	ems := elapsed / 1000
	v.ok = prev*(wms-ems)+(curr+cost+res)*wms <= r.rate*wms
	return v
}

// slidingUsed returns the estimate of the tokens in the sliding window,
// rounded up.
func (r *Rule) slidingUsed(prev, curr, elapsed int64) int64 {
	wms := r.windowUS / 1000
	return ceilDiv(prev*(wms-elapsed/1000), wms) + curr
}

func (r *Rule) slidingResult(v verdict, charged bool, cost int64) Result {
	curr := v.curr
	if charged {
		curr += cost
	}
	res := Result{Remaining: max(0, r.rate-r.slidingUsed(v.prev, curr, v.elapsed))}
	switch {
	case curr > 0: // the current window counts until the next one ends
		res.ResetAfter = us(2*r.windowUS - v.elapsed)
	case v.prev > 0:
		res.ResetAfter = us(r.windowUS - v.elapsed)
	}
	switch {
	case charged || v.ok:
		res.Allowed = true
	case v.never:
		res.RetryAfter = Never
	default:
		res.RetryAfter = us(r.slidingRetry(v, cost+v.res))
	}
	return res
}

// slidingRetry returns the microseconds until a request of cost fits the
// sliding window estimate, if no other request comes: later in this window
// as the previous one's weight falls, or in the next window (where this
// window's count is the previous one), or, at the latest, the one after.
func (r *Rule) slidingRetry(v verdict, cost int64) int64 {
	wms := r.windowUS / 1000
	start := -v.elapsed // the current window's start, relative to now
	// In window k (0: current, 1: next), with counts p (previous) and c
	// (current), the request fits from millisecond e of it on, where
	// p*(wms-e) <= (Rate-c-cost)*wms.
	fits := func(p, c int64) (int64, bool) {
		room := r.rate - c - cost
		if room < 0 {
			return 0, false
		}
		if p == 0 {
			return 0, true
		}
		e := wms - room*wms/p
		if e < 0 {
			e = 0
		}
		return e, e < wms
	}
	if e, ok := fits(v.prev, v.curr); ok {
		// Milliseconds are counted whole: e is reached at its start.
		if t := start + e*1000; t > 0 {
			return t
		}
		return 1
	}
	if e, ok := fits(v.curr, 0); ok {
		return start + r.windowUS + e*1000
	}
	return start + 2*r.windowUS
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
