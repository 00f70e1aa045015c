package limiter

import (
	"time"
)

// The concurrency algorithm: at most Rate requests of a key in flight at
// once. In Redis a key is a sorted set of the slots held (lua/concurrency.lua),
// each scored by the end of its lease, so that the slots of a node that died
// are freed after the lease; in memory it is a count of slots held (the
// State), and a process that dies takes its slots with it.

// concurrencyRule compiles a concurrency zone's rule: cfg.Rate slots,
// leases of cfg.Lease (default DefaultLease).
func concurrencyRule(cfg RuleConfig) (*Rule, error) {
	if cfg.Rate <= 0 {
		return nil, ErrBadLimit
	}
	lease := cfg.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	if lease < time.Millisecond || lease%time.Millisecond != 0 || int64(lease/time.Millisecond) >= maxSlidingWindowMS {
		return nil, ErrBadLease
	}
	return &Rule{name: cfg.Name, bucket: bucketName(cfg.Name, Concurrency), alg: Concurrency,
		rate: cfg.Rate, per: lease, burst: cfg.Rate, exact: true, leaseUS: int64(lease / time.Microsecond)}, nil
}

// slotsCheck evaluates a request of cost slots against a key holding s.
func (r *Rule) slotsCheck(s State, cost int64) verdict {
	held := max(0, int64(s))
	return verdict{slots: held, never: cost > r.rate, ok: cost <= r.rate && held+cost <= r.rate}
}

// slotRetry is the Retry-After of a concurrency zone's denial: slots free
// up whenever requests end, which no one can tell in advance.
const slotRetry = time.Second

// slotsResult is a concurrency zone's result: Remaining is the free slots.
func (r *Rule) slotsResult(v verdict, charged bool, cost int64) Result {
	held := v.slots
	if charged {
		held += cost
	}
	res := Result{Allowed: charged || v.ok, Remaining: max(0, r.rate-held)}
	switch {
	case res.Allowed:
	case v.never:
		res.RetryAfter = Never
	default:
		res.RetryAfter = slotRetry
	}
	return res
}
