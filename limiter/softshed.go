package limiter

import (
	"errors"
	"time"
)

// Soft shedding: a token bucket zone that slows a key down before it
// denies it. Once a key has used more than a share of its burst (the
// threshold), each request the zone admits waits, before it is passed on,
// the time the zone's rate takes to refill what its charge left the bucket
// owing beyond the threshold, at most the rule's longest delay:
//
//	delay = min(maxDelay, ⌈(after − at) / denom⌉ us)
//
// where after is the bucket's debt right after the request's own cost (in
// ticks of 1/denom us, so the excess in ticks over denom is the time the
// rate takes to refill it) and at the threshold's debt (⌊capacity ×
// percent / 100⌋). Integer arithmetic, exact in the script's doubles.
//
// Why the refill time and not a share of maxDelay: a request that waits
// longer than the refill of its excess comes back to a bucket that has
// refilled past the threshold while its key waited, and a key whose
// requests all wait like that lets its bucket run full: tokens it could
// have used are lost (measured with three nodes: a delay rising linearly
// to 1s across the band admitted 10% less than no soft shedding). Waiting
// exactly the refill time spreads the key's requests at the rate, as a
// leaky bucket above the threshold would, and loses nothing: a key with c
// requests in flight settles c tokens past the threshold, where each
// request waits c / rate. It is never denied while those c tokens fit in
// the band (100 − percent of the burst) and c / rate is at most maxDelay;
// a key with more in flight reaches the bottom of the band and is denied
// as without soft shedding, only later and less often.
//
// Admission is unchanged: the delay never admits a request the bucket
// would deny, so the bound burst + rate × elapsed holds as before.

// Errors of a rule's soft shed.
var (
	// ErrSoftShedNotApplicable: soft shedding on an algorithm other than
	// the token bucket.
	ErrSoftShedNotApplicable = errors.New("soft_shed applies to token_bucket only")
	// ErrBadSoftShed: a percentage outside 1 to 99, or a max delay that is
	// not from 1us to MaxSoftShedDelay.
	ErrBadSoftShed = errors.New("soft_shed needs a percentage from 1 to 99 and a max delay from 1us to 1h")
)

// DefaultSoftShedMaxDelay is the longest a soft-shedding zone delays a
// request when its rule says no other.
const DefaultSoftShedMaxDelay = time.Second

// MaxSoftShedDelay is the longest delay a soft shed may have: a request
// held longer keeps a connection for what a client would rarely still
// want.
const MaxSoftShedDelay = time.Hour

// setSoftShed sets the rule's soft shed, while NewRule builds it: pct 0 is
// none, maxDelay 0 DefaultSoftShedMaxDelay.
func (r *Rule) setSoftShed(pct int64, maxDelay time.Duration) error {
	if pct == 0 && maxDelay == 0 {
		return nil
	}
	if r.alg != TokenBucket {
		return ErrSoftShedNotApplicable
	}
	if maxDelay == 0 {
		maxDelay = DefaultSoftShedMaxDelay
	}
	if pct < 1 || pct > 99 || maxDelay < time.Microsecond || maxDelay > MaxSoftShedDelay {
		return ErrBadSoftShed
	}
	r.shedPct, r.shedMaxUS = pct, int64(maxDelay/time.Microsecond)
	r.shedAt = r.capacity * pct / 100 // capacity < 2^50: no overflow
	return nil
}

// SoftShed returns the zone's soft shed: the share of the burst, in
// percent, past which admitted requests are delayed, and the longest delay
// (0 and 0: none).
func (r *Rule) SoftShed() (pct int64, maxDelay time.Duration) {
	return r.shedPct, us(r.shedMaxUS)
}

// shedDelay returns, in microseconds, how long a request admitted with cost
// whose charge left the bucket owing after ticks waits before it is passed
// on: 0 without soft shedding, for a request that takes nothing, and at or
// below the threshold. As token_bucket.lua computes it.
func (r *Rule) shedDelay(after, cost int64) int64 {
	if r.shedMaxUS == 0 || cost <= 0 || after <= r.shedAt {
		return 0
	}
	return min(r.shedMaxUS, ceilDiv(after-r.shedAt, r.denom))
}

// shedDelayLeft is shedDelay for a request admitted from a node's spares
// (prefetch.go): the bucket is taken to hold remaining tokens after it,
// what the node last heard from the store less what it used since.
func (r *Rule) shedDelayLeft(remaining, cost int64) time.Duration {
	if r.shedMaxUS == 0 {
		return 0
	}
	return us(r.shedDelay(r.capacity-min(max(remaining, 0), r.burst)*r.interval, cost))
}
