package limiter

import (
	"errors"
	"time"
)

// Soft shedding: a token bucket zone that delays a key's requests before it
// denies them.

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
// below the threshold. As the script's token bucket computes it.
func (r *Rule) shedDelay(after, cost int64) int64 {
	if r.shedMaxUS == 0 || cost <= 0 || after <= r.shedAt {
		return 0
	}
	return min(r.shedMaxUS, ceilDiv(after-r.shedAt, r.denom))
}

// shedDelayLeft is shedDelay for a request admitted from a node's spares
// (Limiter.decideSpares): the bucket is taken to hold remaining tokens after it,
// what the node last heard from the store less what it used since.
func (r *Rule) shedDelayLeft(remaining, cost int64) time.Duration {
	if r.shedMaxUS == 0 {
		return 0
	}
	return us(r.shedDelay(r.capacity-min(max(remaining, 0), r.burst)*r.interval, cost))
}
