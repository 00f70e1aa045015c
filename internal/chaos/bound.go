package chaos

import (
	"math"
	"time"
)

// recoveryMargin is how long after a fault ends the fleet may still be
// deciding without Redis: the breaker's cooldown, a decision's timeout, and
// the time a node takes to see its probe succeed (nodes come back up to
// about half a second apart on a busy machine).
const recoveryMargin = breakerCooldown + redisTimeout + 500*time.Millisecond

// rejoinMargin replaces recoveryMargin after a Redis restarted empty or a
// failover: the nodes reconnect, reload the script or find the new master,
// which took them up to 2.2 s when measured (issue 26).
const rejoinMargin = 2500 * time.Millisecond

// until is when the fleet is back on Redis after the fault: its end plus
// the margin of its kind.
func (w window) until() time.Time {
	if dataLoss(w.kind) {
		return w.end.Add(rejoinMargin)
	}
	return w.end.Add(recoveryMargin)
}

// boundFactor scales every exact bound. It is 1; a deliberate breakage of
// the checker (a factor of 0.5) must make the bound invariant fail.
var boundFactor = 1.0

// bucketRule is what the exact bound of one bucket needs: the zone's rule
// for the bucket's client, and the reserve its requests keep.
type bucketRule struct {
	zone    *Zone
	rate    int64 // tokens per period (windows: the limit per window)
	burst   int64 // the bucket's capacity (token and leaky buckets)
	per     time.Duration
	reserve int // the percentage every request of the bucket keeps
	nodes   int // the fleet's size
}

// exact is the most tokens the bucket may admit over elapsed, with no
// fault: burst + rate x elapsed for the buckets (less the reserve, which a
// token bucket never gives), and the limit for every window the time
// touches for the windows (less the reserve, in whole requests rounded up,
// for the fixed window and the log, which count it exactly).
func (b bucketRule) exact(elapsed time.Duration) float64 {
	periods := elapsed.Seconds() / b.per.Seconds()
	switch b.zone.Algorithm {
	case TokenBucket:
		// The bucket counts its reserve in ticks of a token: a share of
		// the burst, not rounded to whole tokens.
		return boundFactor * (float64(b.burst)*(1-float64(b.reserve)/100) + float64(b.rate)*periods)
	case LeakyBucket:
		return boundFactor * (float64(b.burst) + float64(b.rate)*periods)
	case FixedWindow:
		// Windows aligned to Redis time: a span touches at most
		// floor(span/per) + 2 of them.
		return boundFactor * float64(b.rate-reserveUnits(b.rate, b.reserve)) * (math.Floor(periods) + 2)
	case SlidingWindow:
		// Each fixed window under the sliding one counts at most the
		// limit (the weighted sum does), whatever the edges admit.
		return boundFactor * float64(b.rate) * (math.Floor(periods) + 2)
	case SlidingLog:
		// At most the limit in any window: a span is covered by
		// floor(span/per) + 1 windows.
		return boundFactor * float64(b.rate-reserveUnits(b.rate, b.reserve)) * (math.Floor(periods) + 1)
	}
	return math.Inf(1)
}

// reserveUnits is the reserve of pct percent of a window's limit, in whole
// requests rounded up, as the limiter counts it.
func reserveUnits(capacity int64, pct int) int64 {
	return (capacity*int64(pct) + 99) / 100
}

// fallbackShare is the allowance named "on_error local fallback": while
// Redis cannot decide (a fault and its margin, see window.until), each of
// the N nodes decides on a bucket of its own with rate/N and burst/N
// (rounded up). A token or leaky bucket starts from what Redis last said
// of the key, and what it admits is charged to Redis when it returns
// (docs/operations.md, "across an outage"): over a fault window of
// length d the fleet may admit N x ceil(burst/N) more than Redis would
// have (keys a node never saw start at its share of the burst), and
// outageSlack of the rate over d (what each node's last answer was
// stale by). The windows start full and are not charged back: N x
// ceil(limit/N) per window the fault touches.
func (b bucketRule) fallbackShare(d time.Duration) float64 {
	n := int64(b.nodes)
	periods := d.Seconds() / b.per.Seconds()
	switch b.zone.Algorithm {
	case TokenBucket, LeakyBucket:
		return float64(n*ceilDiv(b.burst, n)) + outageSlack*float64(b.rate)*periods
	}
	return float64(n*ceilDiv(b.rate, n)) * (math.Floor(periods) + 2)
}

// outageSlack is the share of the rate over a fault window that a token or
// leaky bucket may admit beyond the bound across an outage: the issue's
// target for the whole run is 1.02 of the bound.
const outageSlack = 0.02

// dataLossShare is the allowance named "Redis restarted empty": a Redis
// killed and restarted, or a replica promoted, may have lost the bucket,
// which starts full again: one more burst (the limit of a window).
func (b bucketRule) dataLossShare() float64 {
	if b.burst > 0 {
		return float64(b.burst)
	}
	return float64(b.rate)
}

// evictionShare is the allowance named "evicted buckets": a bucket that
// the node's memory store evicted (max_keys) starts full again. The
// scenarios keep the default max_keys, far above the keys they use, so no
// bucket is evicted and the allowance is zero.
func (b bucketRule) evictionShare() float64 { return 0 }

// concurrencyShare is the allowance of a concurrency zone with on_error
// local during a fault: each node admits ceil(limit/N) of its own.
func concurrencyShare(limit int64, nodes int) int64 {
	n := int64(nodes)
	return n * ceilDiv(limit, n)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
