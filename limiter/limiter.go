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
// most once a second.
type Limiter struct {
	store   Store
	log     *zap.Logger
	lastLog atomic.Int64 // unix nanoseconds of the last failure logged
	failed  atomic.Uint64
}

// New returns a limiter deciding through store and logging store failures
// to log (which may be nil).
func New(store Store, log *zap.Logger) *Limiter {
	if log == nil {
		log = zap.NewNop()
	}
	return &Limiter{store: store, log: log}
}

// Decide decides one request against all its zones; see Store.Decide. On a
// store failure the results are filled as if every zone admitted without
// charge, and the outcome is FailedOpen.
func (l *Limiter) Decide(ctx context.Context, reqs []Request, results []Result) Outcome {
	ok, err := l.store.Decide(ctx, reqs, results)
	if err == nil {
		if ok {
			return Admitted
		}
		return Denied
	}
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
