// Package limiter decides whether requests may pass a set of rate limits.
// It holds the rules, their exact integer arithmetic, the stores that keep
// bucket state (in process memory, or in Redis so that a fleet of nodes
// shares one bucket per key) and the policy applied when a store fails. It
// knows nothing of Caddy.
package limiter

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Never is the RetryAfter of a request that no wait can make admissible: its
// cost exceeds the zone's burst.
const Never time.Duration = -1

// Request is one zone's part of a decision: the rule, the client key the
// bucket belongs to, and how many tokens the request costs.
type Request struct {
	// Rule is the zone's compiled rule.
	Rule *Rule
	// Key identifies the client within the zone. It must be bounded and
	// safe (see ClientKey).
	Key string
	// Cost is how many tokens the request takes; 0 only looks.
	Cost int64
}

// Result is one zone's answer.
type Result struct {
	// Allowed reports whether this zone admits the request. The request
	// as a whole passes only if every zone admits it.
	Allowed bool
	// Remaining is how many tokens the bucket holds after the decision
	// (a request denied by any zone is charged to none).
	Remaining int64
	// RetryAfter is, for a zone that denied, how long until the same
	// request can be admitted by this zone; Never if it never can.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Unknown reports that the zone was not consulted: the deny cache
	// answered the request from another zone's cached denial. Allowed is
	// then true and the other fields are zero.
	Unknown bool

	// owed is the bucket's debt in ticks right after the decision (after
	// the charge if the request was admitted): what the deny cache learns.
	owed int64
}

// Store keeps bucket state and decides against it.
type Store interface {
	// Decide decides all zones of one request at once, atomically: it
	// writes results[i] for reqs[i], and charges every zone if every
	// zone admits, or none otherwise. It reports whether the request
	// was admitted. On error the results are undefined.
	Decide(ctx context.Context, reqs []Request, results []Result) (bool, error)
}

// Outcome is how a request was decided.
type Outcome uint8

// The outcomes of Limiter.Decide.
const (
	// Admitted: every zone admitted the request and was charged.
	Admitted Outcome = iota
	// Denied: at least one zone denied; no zone was charged.
	Denied
	// FailedOpen: the store failed and the request passes unlimited.
	FailedOpen
)

// ErrStoreTimeout is returned by a store whose decision took longer than
// its timeout.
var ErrStoreTimeout = errors.New("rate limit store did not answer in time")

// Limiter applies rules through a store and handles its failures: a failed
// decision admits the request (fails open), and the failure is logged at
// most once a second. With a deny cache, requests that the store has shown
// cannot pass yet are denied on this node without asking it.
type Limiter struct {
	store   Store
	cache   *DenyCache
	log     *zap.Logger
	lastLog atomic.Int64 // unix nanoseconds of the last failure logged
	failed  atomic.Uint64
}

// New returns a limiter deciding through store and logging store failures
// to log (which may be nil). cache may be nil; it is worth having only in
// front of a shared (Redis) store.
func New(store Store, cache *DenyCache, log *zap.Logger) *Limiter {
	if log == nil {
		log = zap.NewNop()
	}
	return &Limiter{store: store, cache: cache, log: log}
}

// Cache returns the limiter's deny cache, or nil.
func (l *Limiter) Cache() *DenyCache { return l.cache }

// Decide decides one request against all its zones; see Store.Decide. On a
// store failure the results are filled as if every zone admitted without
// charge, and the outcome is FailedOpen.
func (l *Limiter) Decide(ctx context.Context, reqs []Request, results []Result) Outcome {
	if l.cache == nil {
		return l.decide(ctx, reqs, results)
	}
	var p probe
	for {
		denied, wait := l.cache.check(reqs, results, &p)
		if denied {
			return Denied
		}
		if wait == nil {
			break
		}
		// Another request is asking the store about one of these
		// buckets; its answer may settle this one too.
		select {
		case <-wait:
		case <-ctx.Done():
			return l.fail(reqs, results, ctx.Err())
		}
	}
	sent := l.cache.now()
	out := l.decide(ctx, reqs, results)
	if out != FailedOpen {
		l.cache.learn(reqs, results, sent, out == Admitted)
	}
	l.cache.release(&p)
	return out
}

func (l *Limiter) decide(ctx context.Context, reqs []Request, results []Result) Outcome {
	ok, err := l.store.Decide(ctx, reqs, results)
	if err == nil {
		if ok {
			return Admitted
		}
		return Denied
	}
	return l.fail(reqs, results, err)
}

// fail applies the failure policy: the request passes unlimited.
func (l *Limiter) fail(reqs []Request, results []Result, err error) Outcome {
	l.failed.Add(1)
	for i := range reqs {
		results[i] = Result{Allowed: true, Remaining: reqs[i].Rule.Burst}
	}
	l.logFailure(err)
	return FailedOpen
}

// Failures returns how many decisions failed over to the policy so far.
func (l *Limiter) Failures() uint64 { return l.failed.Load() }

// logFailure logs a store error, at most once a second, with the number of
// failures since the previous line.
func (l *Limiter) logFailure(err error) {
	now := time.Now().UnixNano()
	last := l.lastLog.Load()
	if now-last < int64(time.Second) || !l.lastLog.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("rate limit store failed; requests pass unlimited (fail open)",
		zap.Error(err), zap.Uint64("failures_total", l.failed.Load()))
}
