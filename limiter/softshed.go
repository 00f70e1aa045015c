package limiter

import (
	"errors"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// Soft shedding: a token bucket zone that slows a key down before it
// denies it. Once a key has used more than a share of its burst (the
// threshold), each request the zone admits is delayed before it is passed
// on, in proportion to how far past the threshold its charge left the
// bucket: nothing at the threshold, the longest delay when it took the
// last token. The delay is
//
//	maxDelay × ⌈(after − at) / unit⌉ / ⌈(capacity − at) / unit⌉, rounded up
//
// where after is the bucket's debt right after the request's own cost (in
// ticks), at the threshold's debt (⌊capacity × percent / 100⌋) and unit the
// smallest whole number of ticks that cuts the band from at to capacity
// into at most lua.ShedSteps steps, so that every product stays an exact
// integer in the script's doubles (maxDelay is at most an hour: 2^32 us).
//
// Admission is unchanged: the delay never admits a request the bucket
// would deny, so the bound burst + rate × elapsed holds as before. What
// changes is the client that waits for its answers (a browser, an SDK with
// a connection pool): its requests are spread out, so it keeps within the
// band rather than emptying the bucket and being denied. A key with c
// requests in flight settles where the delay is c / rate, inside the band
// while that is at most maxDelay: such a key is never denied, and the
// fleet admits what it would have admitted anyway.

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

// MaxSoftShedDelay is the longest delay a soft shed may have: the delay's
// arithmetic stays exact in the script's doubles up to it.
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
	r.shedUnit = ceilDiv(r.capacity-r.shedAt, lua.ShedSteps)
	r.shedSteps = ceilDiv(r.capacity-r.shedAt, r.shedUnit)
	return nil
}

// SoftShed returns the zone's soft shed: the share of the burst, in
// percent, past which admitted requests are delayed, and the longest delay
// (0 and 0: none).
func (r *Rule) SoftShed() (pct int64, maxDelay time.Duration) {
	return r.shedPct, us(r.shedMaxUS)
}

// shedDelay returns, in microseconds, how long a request admitted with cost
// whose charge left the bucket owing after ticks (at most its capacity)
// waits before it is passed on: 0 without soft shedding, for a request that
// takes nothing, and at or below the threshold. As token_bucket.lua
// computes it.
func (r *Rule) shedDelay(after, cost int64) int64 {
	if r.shedMaxUS == 0 || cost <= 0 || after <= r.shedAt {
		return 0
	}
	return ceilDiv(r.shedMaxUS*ceilDiv(min(after, r.capacity)-r.shedAt, r.shedUnit), r.shedSteps)
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
