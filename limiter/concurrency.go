package limiter

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
)

// The concurrency algorithm: at most Rate requests of a key in flight at once,
// each holding a slot until it is refunded or its lease ends.

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

// slotNamer names the concurrency slots of one limiter: a random prefix,
// so that no two nodes (or two configurations of one node) name a slot
// alike, and a counter.
type slotNamer struct {
	prefix atomic.Pointer[string]
	n      atomic.Uint64
}

// next returns a new slot id.
func (s *slotNamer) next() string {
	p := s.prefix.Load()
	if p == nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		v := hex.EncodeToString(b[:]) + ":"
		s.prefix.CompareAndSwap(nil, &v)
		p = s.prefix.Load()
	}
	var buf [48]byte
	return string(strconv.AppendUint(append(buf[:0], *p...), s.n.Add(1), 36))
}
