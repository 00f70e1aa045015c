// Package limiter decides whether requests may pass a set of rate limits.
// It holds the rules, their exact integer arithmetic, the stores that keep
// bucket state (in process memory, or in Redis so that a fleet of nodes
// shares one bucket per key) and the policy applied when a store fails. It
// knows nothing of Caddy.
package limiter

import (
	"context"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// Options are a Limiter's optional parts.
type Options struct {
	// Cache, if set, denies on this node what the store has shown cannot
	// pass yet. Worth having only in front of a shared (Redis) store.
	Cache *DenyCache
	// Local holds the fallback buckets of zones whose policy is local.
	// Required when any zone uses PolicyLocal.
	Local Store
	// Log receives store failures, at most one line a second.
	Log *zap.Logger
	// Observer, if set, is told of every store call and deny cache hit
	// (see Observer).
	Observer Observer
	// FleetSize, if set, returns how many nodes share the limits lately
	// (this one included). The divisor of the local fallback buckets of
	// zones whose fleet size is not fixed is the largest it returned in
	// the last 10 minutes (sampled once a second; see fleetDivisor).
	// Default: 1.
	FleetSize func() int64
}

// Limiter applies rules through a store and handles its failures by each
// zone's policy (allow, deny or local); failures are logged at most once a
// second. With a deny cache, requests that the store has shown cannot pass
// yet are denied on this node without asking it.
type Limiter struct {
	store   Store
	cache   *DenyCache
	local   Store
	log     *zap.Logger
	obs     Observer
	fleet   func() int64
	lastLog atomic.Int64 // unix nanoseconds of the last failure logged
	failed  atomic.Uint64
	// lastCause is the last store error other than an open breaker: why
	// the breaker opened, for the log.
	lastCause atomic.Pointer[error]
	// lastLocal is when the last decision fell back to local buckets
	// (unix nanoseconds), to log when a fallback starts.
	lastLocal atomic.Int64
	// slots names this node's concurrency slots (see slotID).
	slots slotNamer
	// refunds and refundsLost count refunds asked for, and those that
	// the store failed (dropped: the charge stays).
	refunds, refundsLost atomic.Uint64
	// settled and settleLost count settlements (Limiter.Settle) tried, and
	// those the store failed.
	settled, settleLost atomic.Uint64
	// spares holds prefetched tokens (decideSpares); nil until a decision
	// first takes some.
	spares   atomic.Pointer[spares]
	sparesMu sync.Mutex // starting spares
	closed   bool       // Close was called (under sparesMu): no more holders
	// out is the ledger of what local buckets admitted during an outage,
	// charged to the store when it returns (Charge).
	out outage
	// storeUp reports whether the store's last call decided (the
	// charges wait for it); true from New, as no call has failed yet.
	storeUp atomic.Bool
	// resets are the keys reset lately (Limiter.ResetKey).
	resets keyResets
	// div is the largest fleet size seen lately, sampled
	// until stopFleet closes.
	div       fleetDivisor
	stopFleet chan struct{}
	closeOnce sync.Once
}

// New returns a limiter deciding through store.
func New(store Store, opt Options) *Limiter {
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	l := &Limiter{store: store, cache: opt.Cache, local: opt.Local, log: opt.Log, obs: opt.Observer, fleet: opt.FleetSize}
	// Up until a call fails: a node that starts has nothing to charge,
	// and its first requests go to the store, not to local buckets.
	l.storeUp.Store(true)
	l.out.clock = defaultClock
	if c, ok := opt.Local.(interface{ Clock() Clock }); ok {
		l.out.clock = c.Clock() // the local quotas' periods
	}
	l.watchBans()
	l.watchResets()
	l.stopFleet = make(chan struct{})
	if l.fleet != nil {
		go l.sampleFleetEvery(l.stopFleet)
	}
	return l
}

// Cache returns the limiter's deny cache, or nil.
func (l *Limiter) Cache() *DenyCache { return l.cache }

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Decide decides one request against all its zones; see Store.Decide. When
// the store fails, each zone's policy applies (see Outcome); zones left
// unconsulted are marked Unknown. A decision passes through layers, each
// asking the next: the node's prefetched spares (decideSpares), the deny
// cache (decideCached), the outage fallback (decideStore), and the store.
func (l *Limiter) Decide(ctx context.Context, reqs []Request, results []Result) Outcome {
	boundCosts(reqs) // before the spares and the deny cache count with them
	for i := range reqs {
		if reqs[i].Rule.alg == Concurrency && reqs[i].Slot == "" {
			reqs[i].Slot = l.slots.next()
		}
	}
	return l.decideSpares(ctx, reqs, results)
}

// Close refunds the spares this limiter holds and stops its
// background work. Decisions must not be made after it.
func (l *Limiter) Close() {
	l.closeOnce.Do(func() {
		close(l.stopFleet)
		l.out.mu.Lock()
		l.setPending(0) // a limiter gone owes the fleet nothing
		l.out.mu.Unlock()
	})
	l.sparesMu.Lock()
	sp := l.spares.Swap(nil)
	l.closed = true
	l.sparesMu.Unlock()
	if sp != nil {
		close(sp.stop)
		<-sp.done
	}
}
