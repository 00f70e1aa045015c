package limiter

import (
	"context"
	"errors"
	"time"
)

// What a decision is made of: a Request and a Result per zone, the Store
// that decides them, and the Outcome of the request.

// Never is the RetryAfter of a request that no wait can make admissible: its
// cost exceeds the zone's burst. Beware: go-redis/redis_rate uses -1 for
// the opposite (an allowed request, nothing to wait for); here an allowed
// zone's RetryAfter is 0, and -1 means "never".
const Never time.Duration = -1

// Request is one zone's part of a decision: the rule, the client key the
// bucket belongs to, and how many tokens the request costs.
type Request struct {
	// Rule is the zone's compiled rule.
	Rule *Rule
	// Key identifies the client within the zone. It must be bounded and
	// safe (see ClientKey).
	Key string
	// Cost is how many tokens the request takes; 0 only looks. (A
	// concurrency zone: how many slots; 1 as a rule.) Deciding lowers a
	// cost above what the rule could ever admit to one more than that
	// (never admitted either way), and a negative one to 0, in place.
	Cost int64
	// Reserve is the share of the zone's capacity, in percent (0 to 99),
	// that the request must leave after its charge: with 30, it is
	// admitted only if 30% of the burst (the windows: of the limit)
	// remains. Requests with a lower reserve can take more of the bucket,
	// so that critical traffic keeps it when the rest is shed. Concurrency
	// zones take none.
	Reserve int64
	// Slot is, for a concurrency zone, the id of the slot the request
	// holds: unique in the fleet. Limiter.Decide sets it when empty.
	Slot string
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
	// request can be admitted by this zone; Never (-1) if it never can
	// (unlike redis_rate, where -1 means allowed). 0 for a zone that
	// admitted.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again (the window
	// algorithms: until the requests counted now no longer count).
	ResetAfter time.Duration
	// Delay is how long an admitted request must wait before it proceeds:
	// a leaky bucket's turn in the queue, or a soft-shedding token
	// bucket's delay (see RuleConfig.SoftShed; a dry-run zone reports
	// the delay it would ask, for the caller to count, not to wait).
	Delay time.Duration
	// Period is, for a quota, the length of the calendar period the
	// decision fell in (a month of 31 days, a day of 23 hours); 0 for
	// the other algorithms.
	Period time.Duration
	// Unknown reports that the zone was not consulted: the deny cache
	// answered the request from another zone's cached denial. Allowed is
	// then true and the other fields are zero.
	Unknown bool
	// DryRun reports that the zone is a dry run and would have denied
	// the request: Allowed is true (the zone denies nothing), the zone
	// was not charged, and the other fields say what an enforced zone
	// would have answered.
	DryRun bool
	// Banned reports that the zone denied the request because its key is
	// banned; RetryAfter and ResetAfter are the rest of the ban (nothing
	// is admitted before it ends). With DryRun: the key would be banned.
	Banned bool
	// BanStarted reports that this request's denial started the key's
	// ban (with DryRun: would have started it).
	BanStarted bool

	// owed is the bucket's debt in ticks right after the decision (after
	// the charge if the request was admitted): what the deny cache learns.
	// A quota's is its count (DenyCache.rememberQuota).
	owed int64
	// at is the store's time of the decision, in microseconds: what a
	// refund of a window's charge needs to find the window.
	at int64
	// spares are the tokens a prefetching zone took beyond the cost, for
	// this node's next requests (Limiter.decideSpares).
	spares int64
}

// Store keeps bucket state and decides against it.
type Store interface {
	// Decide decides all zones of one request at once, atomically: it
	// writes results[i] for reqs[i], and charges every zone if every
	// zone admits, or none otherwise. It reports whether the request
	// was admitted. On error the results are undefined.
	Decide(ctx context.Context, reqs []Request, results []Result) (bool, error)
	// Refund refunds what Decide charged the zones of reqs (results
	// are what Decide returned for them): a charge that a zone does not
	// count after all, or a concurrency zone's slot when its request
	// ends. A zone whose result is DryRun was not charged and gets
	// nothing back.
	Refund(ctx context.Context, reqs []Request, results []Result) error
}

// Outcome is how a request was decided.
type Outcome uint8

// The outcomes of Limiter.Decide.
const (
	// Allowed: every zone admitted the request and was charged.
	Allowed Outcome = iota
	// Denied: at least one zone denied; no zone was charged.
	Denied
	// FailedOpen: the store failed and every zone's policy is allow: the
	// request passes unlimited.
	FailedOpen
	// FailedClosed: the store failed and a zone's policy is deny: the
	// request is rejected because the limiter cannot decide.
	FailedClosed
	// LocalAllowed: the store failed and the zones with the local policy
	// admitted the request on this node's fallback buckets.
	LocalAllowed
	// LocalDenied: the store failed and a zone with the local policy
	// denied the request on this node's fallback bucket.
	LocalDenied
	// Banned: a zone denied the request because its key is banned (see
	// RuleConfig.Ban). A zone's outcome only: the request's is Denied.
	Banned
	// DryRunDenied: a dry-run zone would have denied the request; it
	// passed, and the zone was not charged. A zone's outcome only: the
	// request's is what the enforced zones decided.
	DryRunDenied
	// Canceled: the request went away (its context ended) before it was
	// decided. It is neither a decision nor a store failure, and no
	// zone was charged by this node's doing; the results are undefined.
	Canceled
)

// String names the outcome as metrics, statistics and events do.
func (o Outcome) String() string {
	switch o {
	case Allowed:
		return "allowed"
	case Denied:
		return "denied"
	case FailedOpen:
		return "failed_open"
	case FailedClosed:
		return "failed_closed"
	case LocalAllowed:
		return "local_allowed"
	case LocalDenied:
		return "local_denied"
	case Banned:
		return "banned"
	case DryRunDenied:
		return "dry_run_denied"
	case Canceled:
		return "canceled"
	}
	return "unknown"
}

// ErrStoreTimeout is returned by a store whose decision took longer than
// its timeout.
var ErrStoreTimeout = errors.New("rate limit store did not answer in time")
